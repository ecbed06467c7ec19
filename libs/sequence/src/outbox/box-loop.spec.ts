import { Logger } from '@nestjs/common';
import { BoxLoop } from './box-loop';

const quiet = new Logger('test');
quiet.warn = jest.fn();

describe('BoxLoop', () => {
  it('runs one more cycle when woken during a cycle, never two at once', async () => {
    let running = 0;
    let overlap = false;
    let cycles = 0;
    let release: () => void = () => undefined;
    const loop = new BoxLoop(
      'outbox_events',
      'test',
      async () => {
        overlap ||= running > 0;
        running++;
        cycles++;
        if (cycles === 1) await new Promise<void>((resolve) => (release = resolve));
        running--;
        return false;
      },
      quiet,
    );
    loop.start(3_600_000); // its first cycle at once
    loop.wake();
    loop.wake();
    release();
    await loop.idle();
    expect(cycles).toBe(2);
    expect(overlap).toBe(false);
    await loop.stop();
  });

  it('runs up to its concurrency at once, and answers wake-ups during them with one more cycle', async () => {
    let running = 0;
    let most = 0;
    let cycles = 0;
    const releases: (() => void)[] = [];
    const loop = new BoxLoop(
      'outbox_events',
      'test',
      async (locked) => {
        running++;
        most = Math.max(most, running);
        cycles++;
        locked(); // its batch in hand: it publishes now
        if (cycles <= 3) await new Promise<void>((resolve) => releases.push(resolve));
        running--;
        return false;
      },
      quiet,
      3,
    );
    loop.start(3_600_000); // its first cycle at once
    loop.wake();
    loop.wake(); // three cycles now
    loop.wake();
    loop.wake();
    loop.wake(); // asked for during them: one more, after the first that ends
    for (const release of releases) release();
    await loop.idle();
    expect(most).toBe(3);
    expect(cycles).toBe(4);
    await loop.stop();
  });

  it('starts no claim while another is locking its batch; one more once it has it, for what came meanwhile', async () => {
    let cycles = 0;
    let lockingAtOnce = 0;
    let mostLocking = 0;
    const locks: (() => void)[] = [];
    const publishes: (() => void)[] = [];
    const loop = new BoxLoop(
      'outbox_events',
      'test',
      async (locked) => {
        cycles++;
        mostLocking = Math.max(mostLocking, ++lockingAtOnce);
        await new Promise<void>((resolve) => locks.push(resolve));
        lockingAtOnce--;
        locked();
        await new Promise<void>((resolve) => publishes.push(resolve));
        return false;
      },
      quiet,
      3,
    );
    loop.start(3_600_000); // its first cycle at once, locking
    loop.wake();
    loop.wake(); // commits while it locks: no claim racing it for the same rows
    expect(cycles).toBe(1);
    locks[0](); // it has its batch: one more claim, for what the wake-ups may have added
    await new Promise((resolve) => setImmediate(resolve));
    expect(cycles).toBe(2);
    locks[1]();
    await new Promise((resolve) => setImmediate(resolve));
    expect(cycles).toBe(2); // nothing asked for while the second one locked
    for (const publish of publishes) publish();
    await loop.idle();
    expect(cycles).toBe(2);
    expect(mostLocking).toBe(1);
    await loop.stop();
  });

  it('drains a backlog with all its claims: a claim that reports more starts one beside the next', async () => {
    let running = 0;
    let most = 0;
    let left = 10; // full batches due
    const releases: (() => void)[] = [];
    const loop = new BoxLoop(
      'outbox_events',
      'test',
      async (locked) => {
        running++;
        most = Math.max(most, running);
        const full = left-- > 0;
        locked();
        await new Promise<void>((resolve) => releases.push(resolve));
        running--;
        return full;
      },
      quiet,
      3,
    );
    loop.start(3_600_000); // its first cycle at once; no commit wakes it again
    const settle = () => new Promise((resolve) => setImmediate(resolve));
    // Each claim ends in turn: every drain goes on while its batches are full.
    while (releases.length > 0) {
      releases.shift()?.();
      for (let turn = 0; turn < 5; turn++) await settle();
    }
    await loop.idle();
    expect(most).toBe(3);
    expect(left).toBeLessThan(0); // every full batch claimed, then the claims that found less
    await loop.stop();
  });

  it('starts no claim beside a full one that ends after it was stopped', async () => {
    let cycles = 0;
    let release: () => void = () => undefined;
    const loop = new BoxLoop(
      'outbox_events',
      'test',
      async (locked) => {
        cycles++;
        locked();
        await new Promise<void>((resolve) => (release = resolve));
        return true; // a full batch: more may be due
      },
      quiet,
      3,
    );
    loop.start(3_600_000);
    const stopped = loop.stop();
    release();
    await stopped;
    expect(cycles).toBe(1);
  });

  it('starts no more claims for a full batch its cycle held off (a broker away)', async () => {
    let cycles = 0;
    const loop = new BoxLoop(
      'outbox_events',
      'test',
      async (locked) => {
        cycles++;
        locked(); // a full batch, released untouched: the cycle reports no more
        await new Promise((resolve) => setImmediate(resolve));
        return false;
      },
      quiet,
      3,
    );
    loop.start(3_600_000);
    await loop.idle();
    expect(cycles).toBe(1);
    await loop.stop();
  });

  it('keeps cycling while a cycle reports more, and stops at once when stopped', async () => {
    let left = 5;
    const loop = new BoxLoop('outbox_events', 'test', () => Promise.resolve(--left > 0), quiet);
    loop.start(3_600_000); // its first cycle at once
    await loop.idle();
    expect(left).toBe(0);
    await loop.stop();
    loop.wake();
    await loop.idle();
    expect(left).toBe(0);
  });

  describe("widening only when behind (a relay's loop)", () => {
    /** A loop whose cycles lock a batch, wait, and report it full as `fullBatches` says. */
    function relayLoop(fullBatches: (cycle: number) => boolean) {
      const state = { cycles: 0, running: 0, most: 0, releases: [] as (() => void)[] };
      const loop = new BoxLoop(
        'outbox_events',
        'test',
        async (locked) => {
          const cycle = ++state.cycles;
          state.most = Math.max(state.most, ++state.running);
          locked(); // its batch in hand: it publishes now
          await new Promise<void>((resolve) => state.releases.push(resolve));
          state.running--;
          return fullBatches(cycle);
        },
        quiet,
        3,
        'when-behind',
      );
      return { loop, state };
    }
    const settle = async () => {
      for (let turn = 0; turn < 5; turn++) await new Promise((resolve) => setImmediate(resolve));
    };

    it('answers commits during a claim with one claim after it, never one beside it', async () => {
      const { loop, state } = relayLoop(() => false);
      loop.start(3_600_000); // its first cycle at once: it takes what is due and publishes
      loop.wake();
      loop.wake();
      loop.wake(); // commits meanwhile: they wait for it, to go out in one larger claim
      await settle();
      expect(state.cycles).toBe(1);
      state.releases.shift()?.();
      await settle();
      expect(state.cycles).toBe(2);
      state.releases.shift()?.();
      await loop.idle();
      expect(state.cycles).toBe(2);
      expect(state.most).toBe(1);
      await loop.stop();
    });

    it('widens after a claim that came back full, up to its concurrency', async () => {
      const { loop, state } = relayLoop((cycle) => cycle <= 3);
      loop.start(3_600_000); // its first cycle at once, which will come back full
      loop.wake(); // waits for it
      await settle();
      expect(state.cycles).toBe(1);
      state.releases.shift()?.(); // full: the next claim, and one beside it
      await settle();
      expect(state.cycles).toBe(3);
      expect(state.running).toBe(2);
      state.releases.shift()?.(); // full again: the next, and a third beside them
      await settle();
      expect(state.running).toBe(3);
      while (state.releases.length > 0) {
        state.releases.shift()?.();
        await settle();
      }
      await loop.idle();
      expect(state.most).toBe(3);
      await loop.stop();
    });
  });

  it('answers a wake-up that comes however soon after a drain ended its last cycle', async () => {
    for (const widening of ['on-wake', 'when-behind'] as const) {
      for (let ticks = 0; ticks < 12; ticks++) {
        let cycles = 0;
        const loop: BoxLoop = new BoxLoop(
          'outbox_events',
          'test',
          async () => {
            cycles++;
            if (cycles === 1) {
              // A commit that wakes the loop `ticks` microtasks after this cycle returns.
              let later = Promise.resolve();
              for (let i = 0; i < ticks; i++) later = later.then(() => undefined);
              void later.then(() => loop.wake());
            }
            return false;
          },
          quiet,
          widening === 'on-wake' ? 1 : 3,
          widening,
        );
        loop.start(3_600_000); // no poll during the test
        await new Promise((resolve) => setImmediate(resolve));
        await loop.idle();
        expect({ widening, ticks, cycles }).toEqual({ widening, ticks, cycles: 2 });
        await loop.stop();
      }
    }
  });

  it('a failing cycle is logged, and the next wake-up tries again', async () => {
    let calls = 0;
    const loop = new BoxLoop(
      'outbox_events',
      'test',
      () => (++calls === 1 ? Promise.reject(new Error('db down')) : Promise.resolve(false)),
      quiet,
    );
    loop.start(3_600_000); // its first cycle at once
    await loop.idle();
    expect(quiet.warn).toHaveBeenCalledWith('test: db down');
    loop.wake();
    await loop.idle();
    expect(calls).toBe(2);
  });

  it('a wake-up during a failing cycle is kept: one more cycle shortly after, not at the next poll', async () => {
    let calls = 0;
    let fail: (error: Error) => void = () => undefined;
    const loop = new BoxLoop(
      'outbox_events',
      'test',
      async () => {
        calls++;
        if (calls === 1) await new Promise<void>((_, reject) => (fail = reject));
        return false;
      },
      quiet,
    );
    loop.start(60_000); // the first cycle, which fails while a commit wakes the loop
    loop.start(3_600_000); // its first cycle at once
    fail(new Error('connection terminated'));
    await loop.idle();

    const deadline = Date.now() + 2_000;
    while (calls < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(calls).toBe(2);
    await loop.stop();
  });

  it('runs nothing before it is started: a wake-up before the outbox has fully started is ignored', async () => {
    let calls = 0;
    const loop = new BoxLoop('outbox_events', 'test', () => Promise.resolve(++calls < 0), quiet);
    loop.wake();
    await loop.idle();
    expect(calls).toBe(0);
    loop.start(3_600_000);
    await loop.idle();
    expect(calls).toBe(1);
    await loop.stop();
  });

  it('polls every pollIntervalMs once started', async () => {
    let calls = 0;
    const loop = new BoxLoop('outbox_events', 'test', () => Promise.resolve(++calls < 0), quiet);
    loop.start(10);
    await new Promise((resolve) => setTimeout(resolve, 75));
    await loop.stop();
    expect(calls).toBeGreaterThanOrEqual(3);
  });
});
