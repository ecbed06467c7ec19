import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { alertRules, PROMETHEUS_CONFIG, ROOT, RULES_FILE, RULES_TEST_FILE } from './shipped-files';

/** Debian's `prometheus` package ships it; CI installs it (.ci/run). */
const PROMTOOL = process.env.PROMTOOL ?? 'promtool';
const promtoolFound = spawnSync(PROMTOOL, ['--version']).status === 0;
/** Without promtool: skipped on a developer's machine, a failure under CI=true. */
const withPromtool = promtoolFound || process.env.CI === 'true' ? it : it.skip;

function promtool(...args: string[]): { status: number | null; output: string } {
  if (!promtoolFound) {
    throw new Error(
      `${PROMTOOL} was not found: install Debian's prometheus package (apt-get install ` +
        'prometheus), or set PROMTOOL to its path',
    );
  }
  const result = spawnSync(PROMTOOL, args, { cwd: dirname(RULES_FILE), encoding: 'utf8' });
  return { status: result.status, output: `${result.stdout}${result.stderr}` };
}

/** GitHub's anchors of a Markdown page's headings. */
function anchorsOf(markdown: string): Set<string> {
  const anchors = new Set<string>();
  for (const [, heading] of markdown.matchAll(/^#{1,6}\s+(.+)$/gm)) {
    anchors.add(
      heading
        .trim()
        .toLowerCase()
        .replace(/[^\p{L}\p{N}\s_-]/gu, '')
        .replace(/\s/g, '-'),
    );
  }
  return anchors;
}

describe('the shipped Prometheus rules', () => {
  withPromtool('parse (promtool check rules)', () => {
    const { status, output } = promtool('check', 'rules', RULES_FILE);
    expect({ status, output }).toMatchObject({ status: 0 });
    expect(output).toMatch(/SUCCESS: \d+ rules found/);
  });

  withPromtool('fire and stay quiet as their unit tests say (promtool test rules)', () => {
    const { status, output } = promtool('test', 'rules', RULES_TEST_FILE);
    expect({ status, output }).toMatchObject({ status: 0 });
  });

  withPromtool("Prometheus's config for the local stack is valid and loads them", () => {
    const { status, output } = promtool('check', 'config', PROMETHEUS_CONFIG);
    expect({ status, output }).toMatchObject({ status: 0 });
    expect(output).toContain('SUCCESS: 1 rule files found');
  });

  it('every alert has a unit test that expects it to fire', () => {
    const tests = readFileSync(RULES_TEST_FILE, 'utf8');
    for (const { alert } of alertRules()) {
      expect({
        alert,
        fires: new RegExp(`alertname: ${alert}\\n\\s+exp_alerts:\\n\\s+- exp_labels`).test(tests),
      }).toEqual({
        alert,
        fires: true,
      });
    }
  });

  it('every alert has a severity, a summary, a description and a runbook anchor that exists', () => {
    const operations = join(ROOT, 'docs', 'operations.md');
    expect(existsSync(operations)).toBe(true);
    const anchors = anchorsOf(readFileSync(operations, 'utf8'));
    for (const rule of alertRules()) {
      expect({ alert: rule.alert, severity: rule.labels?.severity }).toEqual({
        alert: rule.alert,
        severity: expect.stringMatching(/^(warning|critical)$/) as string,
      });
      expect(rule.annotations?.summary).toBeTruthy();
      expect(rule.annotations?.description).toBeTruthy();
      const [page, anchor] = (rule.annotations?.runbook_url ?? '').split('#');
      expect({ alert: rule.alert, page, anchor: anchors.has(anchor) }).toEqual({
        alert: rule.alert,
        page: 'docs/operations.md',
        anchor: true,
      });
    }
  });
});
