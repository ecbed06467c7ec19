import { Logger, type CanActivate } from '@nestjs/common';
import { request as httpRequest } from 'node:http';
import { createAdminApp, type AdminApp } from './admin-app';

/** A raw HTTP request: unlike fetch, it may send any Host. */
function send(
  url: string,
  method: string,
  headers: Record<string, string>,
  body = '',
): Promise<{ status: number; body: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method, headers }, (response) => {
      let text = '';
      response.setEncoding('utf8');
      response.on('data', (chunk: string) => (text += chunk));
      response.on('end', () =>
        resolve({ status: response.statusCode ?? 0, body: JSON.parse(text) as never }),
      );
    });
    req.on('error', reject);
    req.end(body);
  });
}

describe('the admin API with no guard and mutations on, against other sites', () => {
  let admin: AdminApp;

  beforeAll(async () => {
    admin = await createAdminApp({ admin: { mutations: true } });
  });

  afterAll(async () => {
    await admin.close();
  });

  it('refuses a cross-site form post: urlencoded, without the console header', async () => {
    const form = await admin.postRaw('dead-letters/orders/discard', 'reason=boom', {
      'content-type': 'application/x-www-form-urlencoded',
    });
    expect(form).toMatchObject({ status: 403, body: { error: 'forbidden' } });
    expect(form.body.message).toMatch(/Content-Type: application\/json.*X-Sequence-Admin: 1/);
  });

  it('refuses a bodiless post to skip or release', async () => {
    for (const action of ['skip', 'release']) {
      const bare = await admin.postRaw(`resequencer/gaps/none/key-1/${action}`, '', {});
      expect(bare).toMatchObject({ status: 403, body: { error: 'forbidden' } });
    }
  });

  it('refuses JSON the browser marks cross-site, and takes it from the page', async () => {
    const cross = await admin.postRaw('resequencer/gaps/none/key-1/skip', '{}', {
      'content-type': 'application/json',
      'x-sequence-admin': '1',
      'sec-fetch-site': 'cross-site',
    });
    expect(cross).toMatchObject({ status: 403, body: { error: 'forbidden' } });
    const page = await admin.postRaw('resequencer/gaps/none/key-1/skip', '{}', {
      'content-type': 'application/json',
      'x-sequence-admin': '1',
      'sec-fetch-site': 'same-origin',
    });
    expect(page).toMatchObject({ status: 404, body: { error: 'not-found' } });
  });

  it('refuses a DNS-rebound Host and a request forwarded by a local proxy', async () => {
    const url = `${admin.api}/overview`;
    expect((await send(url, 'GET', {})).status).toBe(200);
    expect((await send(url, 'GET', { host: 'localhost:3000' })).status).toBe(200);
    const rebound = await send(url, 'GET', { host: 'evil.example:3000' });
    expect(rebound).toMatchObject({ status: 403, body: { error: 'forbidden' } });
    expect(rebound.body.message).toMatch(/Host "evil\.example:3000"/);
    for (const name of ['forwarded', 'x-forwarded-for', 'x-real-ip']) {
      const proxied = await send(url, 'GET', { [name]: '203.0.113.9' });
      expect(proxied).toMatchObject({ status: 403, body: { error: 'forbidden' } });
    }
  });
});

describe('the admin module at start', () => {
  afterEach(() => jest.restoreAllMocks());

  it('warns when actions are on with no guard: a local proxy without forwarding headers passes', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const warnings = () =>
      warn.mock.calls.map(([message]) => String(message)).filter((m) => m.includes('no guard'));
    const allow: CanActivate = { canActivate: () => true };

    for (const admin of [{ mutations: false }, { mutations: true, guard: allow }]) {
      await (await createAdminApp({ admin })).close();
    }
    expect(warnings()).toEqual([]);

    await (await createAdminApp({ admin: { mutations: true } })).close();
    expect(warnings()).toEqual([
      expect.stringMatching(
        /^the console at \/sequence-admin takes actions \(mutations: true\) with no guard: .*give SequenceAdminModule a guard$/,
      ),
    ]);
  });
});
