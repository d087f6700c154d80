#!/usr/bin/env python3
"""Goodput of a supervised run under injected faults (docs/PERFORMANCE.md).

    bench/goodput_bench.py FOUNDRY [--minutes 20] [--np 2] [--config configs/moe-bench.json]
                                   [--checkpoint-s 60] [--memory-every 5] [--fault-every 150 270]
                                   [--seed 7]

Runs `foundry launch --np N` on random tokens with asynchronous checkpoints about every
--checkpoint-s seconds (steps per checkpoint from a short calibration run, repeated after the
run: the step time divided by is the mean of the two) and in-memory
checkpoints every --memory-every steps (0 = none), kills a random rank
with SIGKILL at random intervals (uniform in --fault-every seconds), stops one rank with SIGSTOP
once (the third fault: a hang), and after --minutes sends SIGTERM to launch (the job saves a
checkpoint and exits). Reports goodput: the steps in the final metrics.jsonl times the
calibration run's step time (no faults, no checkpoints) over the wall time of launch, so that
checkpointing's own cost counts as lost (and, as before, their logged step time over the wall
time); and per fault: detection time (fault -> the first event naming
it), restart time (fault -> the first step of the new attempt completed), steps lost.
"""
import argparse, json, os, random, signal, subprocess, sys, tempfile, time

def events(run):
    try:
        return [json.loads(l) for l in open(os.path.join(run, 'events.jsonl')) if l.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []

def metrics(run):
    out = []
    try:
        for l in open(os.path.join(run, 'metrics.jsonl')):
            try: out.append(json.loads(l))
            except json.JSONDecodeError: pass
    except FileNotFoundError: pass
    return out

def last_step(run):
    m = metrics(run)
    return m[-1]['step'] if m else 0

def rank_pid(run, rank):
    try:
        return json.load(open(os.path.join(run, 'heartbeat', 'rank_%05d.json' % rank)))['pid']
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None

def calibrate(args, work, name):
    """Seconds per step of the config on this layout: the median of 30 steps after 3."""
    run = os.path.join(work, name)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1')
    subprocess.run([args.foundry, 'launch', '--config', args.config, '--synthetic-data', '-q',
                    '--np', str(args.np), '--steps', '33', '--set', 'train.run_dir=' + run,
                    'train.checkpoint_every=0', 'train.peak_gflops=1000'], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times = sorted(m['step_time_s'] for m in metrics(run)[3:])
    return times[len(times) // 2]

def main():
    p = argparse.ArgumentParser()
    p.add_argument('foundry')
    p.add_argument('--minutes', type=float, default=20)
    p.add_argument('--np', type=int, default=2)
    p.add_argument('--config', default=os.path.join(os.path.dirname(__file__), '..', 'configs', 'moe-bench.json'))
    p.add_argument('--checkpoint-s', type=float, default=60)
    p.add_argument('--memory-every', type=int, default=5)
    p.add_argument('--fault-every', type=float, nargs=2, default=[150, 270])
    p.add_argument('--seed', type=int, default=7)
    args = p.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix='foundry_goodput.')
    step_s = calibrate(args, work, 'calibrate')
    every = max(1, round(args.checkpoint_s / step_s))
    run = os.path.join(work, 'run')
    print('# foundry: goodput under injected faults')
    print('date: %s | host: %s | cpu: %s | cores: %d' % (
        time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), os.uname().nodename,
        next(l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')),
        os.cpu_count()))
    print('command: bench/goodput_bench.py %s' % ' '.join(sys.argv[1:]))
    print('config: %s, %d ranks, %.3f s/step (calibration), checkpoint every %d steps (%.0f s), '
          'in-memory checkpoint every %d steps, faults every %.0f-%.0f s' % (
              os.path.basename(args.config), args.np, step_s, every, every * step_s,
              args.memory_every, *args.fault_every))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1')
    cmd = [args.foundry, 'launch', '--config', args.config, '--synthetic-data', '-q', '--np',
           str(args.np), '--steps', '1000000', '--max-restarts', '100', '--set',
           'train.run_dir=' + run, 'train.checkpoint_every=%d' % every, 'train.keep_checkpoints=2',
           'train.peak_gflops=1000', 'train.memory_checkpoint_every=%d' % args.memory_every]
    log = open(os.path.join(work, 'launch.log'), 'w')
    t_start = time.time()
    launch = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = t_start + args.minutes * 60
    faults = []
    next_fault = t_start + rng.uniform(*args.fault_every)
    while time.time() < deadline and launch.poll() is None:
        time.sleep(0.2)
        now = time.time()
        if now < next_fault or now + 30 > deadline:
            continue
        rank = rng.randrange(args.np)
        pid = rank_pid(run, rank)
        if pid is None or last_step(run) == 0:
            continue
        kind = 'SIGSTOP (hang)' if len(faults) == 2 else 'SIGKILL'
        os.kill(pid, signal.SIGSTOP if kind.startswith('SIGSTOP') else signal.SIGKILL)
        fault = {'kind': kind, 'rank': rank, 'time': now, 'step': last_step(run)}
        faults.append(fault)
        # Detection: the first event after the fault; restart: the new attempt's first step.
        n_events = len(events(run))
        while time.time() < deadline:
            time.sleep(0.05)
            ev = [e for e in events(run)[n_events:] if e['event'] in ('rank_lost', 'hang', 'failure')]
            if ev and 'detected' not in fault:
                fault['detected'] = ev[0]['unix'] - now
            restarts = [e for e in events(run)[n_events:] if e['event'] == 'restart']
            if restarts:
                fault['steps_lost'] = restarts[0]['steps_lost']
                # The new attempt first cuts metrics.jsonl back to its checkpoint, then trains.
                step = last_step(run)
                if step <= restarts[0]['from_step']:
                    fault['truncated'] = True
                elif fault.get('truncated'):
                    fault['restart'] = time.time() - now
                    break
        if kind.startswith('SIGSTOP'):
            try: os.kill(pid, signal.SIGKILL)
            except ProcessLookupError: pass
        next_fault = time.time() + rng.uniform(*args.fault_every)
    launch.send_signal(signal.SIGTERM)
    rc = launch.wait()
    wall = time.time() - t_start
    final = metrics(run)
    logged = sum(m['step_time_s'] for m in final)
    # This shared machine's speed drifts over minutes: calibrate again after the run and
    # divide by the mean of the two.
    before, after = step_s, calibrate(args, work, 'calibrate_after')
    step_s = (before + after) / 2
    print('launch exit code %d (75 = stopped with a checkpoint) | wall %.1f s | %d steps kept'
          % (rc, wall, len(final)))
    print('fault-free step time: %.3f s before the run, %.3f s after, %.3f s their mean; the '
          'median step of the run itself: %.3f s' % (
              before, after, step_s, sorted(m['step_time_s'] for m in final)[len(final) // 2]))
    print('goodput %.1f%% (steps kept x %.3f s fault-free step time / wall); their logged step '
          'time %.1f s is %.1f%% of the wall time' % (100 * len(final) * step_s / wall, step_s,
                                                      logged, 100 * logged / wall))
    print('| fault | rank | at step | detected after (s) | restart: fault -> first new step (s) | steps lost |')
    print('| --- | --- | --- | --- | --- | --- |')
    for f in faults:
        print('| %s | %d | %d | %s | %s | %s |' % (
            f['kind'], f['rank'], f['step'], '%.1f' % f['detected'] if 'detected' in f else '?',
            '%.1f' % f['restart'] if 'restart' in f else '?', f.get('steps_lost', '?')))
    lost = sum(f.get('steps_lost', 0) for f in faults)
    print('steps lost in all: %d (%.0f s of step time); checkpoint interval %d steps' % (lost, lost * step_s, every))
    print('work directory (events.jsonl, launch.log): %s' % work)

if __name__ == '__main__':
    main()
