import type { Registry } from 'prom-client';

/**
 * One metric's value, summed over its series whose labels include `labels`, read without
 * collecting the rest of the registry (whose store-backed gauges need the store to answer).
 */
export async function singleMetricValue(
  registry: Registry,
  name: string,
  labels: Record<string, string> = {},
): Promise<number> {
  const metric = registry.getSingleMetric(name);
  if (!metric) throw new Error(`no metric ${name} in the registry`);
  const { values } = await metric.get();
  return values
    .filter((value) =>
      Object.entries(labels).every(
        ([label, expected]) => (value.labels as Record<string, unknown>)[label] === expected,
      ),
    )
    .reduce((sum, value) => sum + value.value, 0);
}
