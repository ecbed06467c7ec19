import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CONSOLE_PAGE_DIRECTORY, loadConsoleFiles } from '../../src/admin/console/console-page';
import { createAdminApp, SwitchGuard, type AdminApp } from './admin-app';

describe('the console page files', () => {
  it('are found next to the module, the page and every module it imports', () => {
    const files = loadConsoleFiles(CONSOLE_PAGE_DIRECTORY);
    const html = files.get('index.html')!.body.toString('utf8');
    const imported = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((match) => match[1]);
    for (const name of files.keys()) {
      if (!name.endsWith('.js')) continue;
      const source = files.get(name)!.body.toString('utf8');
      imported.push(...[...source.matchAll(/from '\.\/([^']+)'/g)].map((match) => match[1]));
    }
    expect(imported.length).toBeGreaterThan(3);
    expect(imported.filter((name) => !files.has(name))).toEqual([]);
  });

  it('name the directory when the build did not copy them', () => {
    expect(() => loadConsoleFiles(join(tmpdir(), 'no-such-console-page'))).toThrow(
      /no-such-console-page.*nest-cli\.json's assets/s,
    );
  });

  it('are only the page types: nothing else in the directory is served', () => {
    const directory = mkdtempSync(join(tmpdir(), 'console-page-'));
    try {
      writeFileSync(join(directory, 'index.html'), '<!doctype html>');
      writeFileSync(join(directory, 'secret.json'), '{}');
      writeFileSync(join(directory, 'page.tsconfig.json'), '{}');
      expect([...loadConsoleFiles(directory).keys()]).toEqual(['index.html']);
    } finally {
      rmSync(directory, { recursive: true, force: true });
    }
  });
});

describe('the console page, served by SequenceAdminModule', () => {
  let admin: AdminApp;
  const guard = new SwitchGuard();
  const page = () => admin.api.replace(/api$/, '');

  beforeAll(async () => {
    admin = await createAdminApp({ admin: { guard } });
  });

  afterAll(async () => {
    await admin.close();
  });

  afterEach(() => {
    guard.allow = true;
  });

  it('serves the page with a self-only CSP, and its modules as JavaScript', async () => {
    const html = await fetch(page());
    expect(html.status).toBe(200);
    expect(html.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(html.headers.get('content-security-policy')).toMatch(/^default-src 'none'; /);
    expect(html.headers.get('x-content-type-options')).toBe('nosniff');
    const script = await fetch(`${page()}console.js`);
    expect(script.status).toBe(200);
    expect(script.headers.get('content-type')).toBe('text/javascript; charset=utf-8');
  });

  it('answers 304 to a request that has the current version', async () => {
    const first = await fetch(`${page()}console.css`);
    const again = await fetch(`${page()}console.css`, {
      headers: { 'if-none-match': first.headers.get('etag')! },
    });
    expect(again.status).toBe(304);
  });

  it('redirects the path without its slash to the page', async () => {
    const response = await fetch(page().replace(/\/$/, ''), { redirect: 'manual' });
    expect(response.status).toBe(308);
    expect(response.headers.get('location')).toBe('sequence-admin/');
  });

  it('answers 404 not-found for any other file, a path outside the page included', async () => {
    for (const name of ['nope.js', 'page.tsconfig.json', '..%2Fconsole-page.ts', 'index.html']) {
      const response = await fetch(`${page()}${name}`);
      expect({ name, status: response.status }).toEqual({ name, status: 404 });
      expect(await response.json()).toMatchObject({ error: 'not-found' });
    }
  });

  it('is behind the console guard, as the API is', async () => {
    guard.allow = false;
    const response = await fetch(page());
    expect(response.status).toBe(403);
    expect(await response.json()).toMatchObject({ error: 'forbidden' });
  });
});
