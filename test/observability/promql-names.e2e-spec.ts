import { expandGrafanaVariables, promqlNames } from './promql-names';

describe('promqlNames', () => {
  it('finds metric names, matcher labels and grouping labels; not functions, keywords, durations', () => {
    expect(
      promqlNames(
        'histogram_quantile(0.99, sum by (job, channel, le) (rate(x_bucket{job=~"a|b"}[10m]))) > 60',
      ),
    ).toEqual({
      selectors: [{ metric: 'x_bucket', labels: ['job'] }],
      grouping: ['job', 'channel', 'le'],
    });
  });

  it('skips the insides of strings, even ones that look like selectors', () => {
    expect(promqlNames('sum(a{reason!~"b{c=\\"d\\"}|sum by (e)"}) without (f)')).toEqual({
      selectors: [{ metric: 'a', labels: ['reason'] }],
      grouping: ['f'],
    });
  });

  it('reads binary operators with on / group_left, offset, unless and numbers with exponents', () => {
    expect(
      promqlNames(
        'max by (r) (a) > on (job, r) group_left (x) max by (r) (b offset 15m) unless c == 1e3 and d bool > 0.5',
      ),
    ).toEqual({
      selectors: ['a', 'b', 'c', 'd'].map((metric) => ({ metric, labels: [] })),
      grouping: ['r', 'job', 'r', 'x', 'r'],
    });
  });

  it('takes __name__ matchers as the metric name', () => {
    expect(promqlNames('{__name__="m", job="j"}')).toEqual({
      selectors: [{ metric: 'm', labels: ['job'] }],
      grouping: [],
    });
  });

  it('refuses what it cannot read rather than guessing', () => {
    expect(() => promqlNames('a{job="x}')).toThrow(/unterminated string/);
    expect(() => promqlNames('{job="x"}')).toThrow(/without a metric name/);
  });

  it("replaces Grafana's variables as Grafana would", () => {
    expect(
      expandGrafanaVariables('rate(${prefix}a{job=~"$job"}[$__rate_interval]) + $prefix', 'p_'),
    ).toBe('rate(p_a{job=~".*"}[5m]) + p_');
  });
});
