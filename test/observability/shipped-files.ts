import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse } from 'yaml';

/** The repository's root, and the folder users copy. */
export const ROOT = join(__dirname, '..', '..');
export const OBSERVABILITY = join(ROOT, 'observability');
export const RULES_FILE = join(OBSERVABILITY, 'prometheus', 'nest-sequence.rules.yml');
export const RULES_TEST_FILE = join(OBSERVABILITY, 'prometheus', 'nest-sequence.rules.test.yml');
export const PROMETHEUS_CONFIG = join(OBSERVABILITY, 'prometheus', 'prometheus.yml');
export const DASHBOARD_FILE = join(OBSERVABILITY, 'grafana', 'dashboards', 'nest-sequence.json');

export interface AlertRule {
  readonly alert: string;
  readonly expr: string;
  readonly for?: string;
  readonly labels?: Record<string, string>;
  readonly annotations?: Record<string, string>;
}

export function alertRules(): AlertRule[] {
  const file = parse(readFileSync(RULES_FILE, 'utf8')) as {
    groups: { name: string; rules: AlertRule[] }[];
  };
  return file.groups.flatMap((group) => group.rules);
}

export interface DashboardPanel {
  readonly id: number;
  readonly type: string;
  readonly title: string;
  readonly datasource?: { type: string; uid: string };
  readonly gridPos: { h: number; w: number; x: number; y: number };
  readonly targets?: { refId: string; expr: string; legendFormat?: string }[];
  readonly panels?: DashboardPanel[];
}

export interface Dashboard {
  readonly uid: string;
  readonly title: string;
  readonly panels: DashboardPanel[];
  readonly templating: {
    list: { name: string; type: string; query: unknown; current?: { value?: unknown } }[];
  };
}

export function dashboard(): Dashboard {
  return JSON.parse(readFileSync(DASHBOARD_FILE, 'utf8')) as Dashboard;
}

/** Every panel, those inside collapsed rows included. */
export function dashboardPanels(board: Dashboard = dashboard()): DashboardPanel[] {
  return board.panels.flatMap((panel) => [panel, ...(panel.panels ?? [])]);
}

/** The dashboard's metric prefix variable's default: what its queries expand to. */
export function dashboardPrefix(board: Dashboard = dashboard()): string {
  const variable = board.templating.list.find((each) => each.name === 'prefix');
  if (!variable || typeof variable.query !== 'string') {
    throw new Error('the dashboard has no textbox variable `prefix`');
  }
  return variable.query;
}
