import { formatMs, HealthVerdict, type HealthMeasure } from './health-verdict';

function measure(value: number, limit: number | undefined, downAtLimit = false): HealthMeasure {
  return {
    threshold: 'outbox.lagMs',
    value,
    limit,
    downAtLimit,
    runbook: 'docs/operations.md#outbox-lag',
    describe: (v, l) => `lag ${v}, limit ${l}`,
  };
}

describe('HealthVerdict', () => {
  it('is down when a value passes its limit, naming the threshold, the value and the limit', () => {
    const verdict = new HealthVerdict(0.8);
    verdict.judge(measure(301, 300));
    expect(verdict.down).toBe(true);
    expect(verdict.findings()).toEqual({
      tripped: [
        {
          threshold: 'outbox.lagMs',
          value: 301,
          limit: 300,
          message: 'lag 301, limit 300',
          runbook: 'docs/operations.md#outbox-lag',
        },
      ],
    });
  });

  it('is not down at the limit itself, unless the threshold is reached at it (a percent full)', () => {
    const passes = new HealthVerdict(undefined);
    passes.judge(measure(300, 300));
    expect(passes.down).toBe(false);
    const reaches = new HealthVerdict(undefined);
    reaches.judge(measure(80, 80, true));
    expect(reaches.down).toBe(true);
  });

  it('warns, staying up, from warnRatio of the limit', () => {
    const verdict = new HealthVerdict(0.8);
    verdict.judge(measure(239, 300));
    expect(verdict.findings()).toEqual({});
    verdict.judge(measure(240, 300));
    expect(verdict.down).toBe(false);
    expect(verdict.findings().warnings).toEqual([
      expect.objectContaining({ value: 240, limit: 300, message: 'lag 240, limit 300' }),
    ]);
  });

  it('never warns of a zero value, nor without a warnRatio', () => {
    const zero = new HealthVerdict(0.8);
    zero.judge(measure(0, 0));
    expect(zero.findings()).toEqual({});
    const none = new HealthVerdict(undefined);
    none.judge(measure(299, 300));
    expect(none.findings()).toEqual({});
  });

  it('judges nothing against a threshold that is off', () => {
    const verdict = new HealthVerdict(0.8);
    verdict.judge(measure(1e9, undefined));
    expect(verdict.down).toBe(false);
    expect(verdict.findings()).toEqual({});
  });

  it('keeps every tripped threshold, with its subject', () => {
    const verdict = new HealthVerdict(0.8);
    verdict.judge({ ...measure(5, 0), threshold: 'outbox.failed', subject: 'outbox_events' });
    verdict.judge({ ...measure(2, 0), threshold: 'inbox.failed', subject: 'inbox_events' });
    expect(verdict.findings().tripped?.map((each) => [each.threshold, each.subject])).toEqual([
      ['outbox.failed', 'outbox_events'],
      ['inbox.failed', 'inbox_events'],
    ]);
  });
});

describe('formatMs', () => {
  it.each([
    [950, '950 ms'],
    [42_500, '42.5 s'],
    [301_000, '5 min'],
    [18_720_000, '5.2 h'],
  ])('%d ms reads %s', (ms, text) => {
    expect(formatMs(ms)).toBe(text);
  });
});
