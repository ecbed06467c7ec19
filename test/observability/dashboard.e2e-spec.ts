import { readFileSync } from 'node:fs';
import { DASHBOARD_FILE, dashboard, dashboardPanels } from './shipped-files';

/** Structure of the Grafana dashboard (its queries are checked in metrics-coverage). */
describe('the shipped Grafana dashboard', () => {
  it('is JSON with a uid, a title and the datasource and prefix variables', () => {
    expect(() => JSON.parse(readFileSync(DASHBOARD_FILE, 'utf8')) as unknown).not.toThrow();
    const board = dashboard();
    expect(board.uid).toBe('nest-sequence');
    expect(board.title).toBeTruthy();
    const variables = Object.fromEntries(board.templating.list.map((each) => [each.name, each]));
    expect(variables.datasource).toMatchObject({ type: 'datasource', query: 'prometheus' });
    expect(variables.prefix).toMatchObject({ type: 'textbox', query: 'nest_sequence_' });
  });

  it('gives every panel a unique id, a place on the 24-column grid and queries on the chosen datasource', () => {
    const panels = dashboardPanels();
    const ids = panels.map((panel) => panel.id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const panel of panels) {
      const { x, w, h } = panel.gridPos;
      expect({ title: panel.title, fits: x >= 0 && w > 0 && h > 0 && x + w <= 24 }).toEqual({
        title: panel.title,
        fits: true,
      });
      if (panel.type === 'row') continue;
      expect({ title: panel.title, datasource: panel.datasource?.uid }).toEqual({
        title: panel.title,
        datasource: '${datasource}',
      });
      expect(panel.targets?.length).toBeGreaterThan(0);
      for (const target of panel.targets ?? []) {
        expect(target.expr).toContain('${prefix}');
      }
    }
  });

  it('covers the four patterns and dead letters, each in a row of its own', () => {
    const rows = dashboardPanels()
      .filter((panel) => panel.type === 'row')
      .map((panel) => panel.title);
    expect(rows).toEqual(
      expect.arrayContaining([
        'Message Sequence',
        'Claim Check',
        'Resequencer',
        'Outbox / Inbox',
        'Dead letters',
      ]),
    );
  });
});
