import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Injectable, Module, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import {
  ClaimCheck,
  ClaimCheckService,
  InMemoryTransport,
  OutboxService,
  SequencedHandler,
  SequenceModule,
  type ClaimedPayload,
  type ReassembledPayload,
} from 'nest-sequence';
import { SequenceAdminModule } from 'nest-sequence/admin';
import type { HeaderMap, PublishOptions } from 'nest-sequence/ports';
import type { Page } from 'playwright-core';
import { eventually, makeFragments } from '../libs/sequence/test/support/sequence-test-app';
import { describeWithChromium, launchChromium, type TestBrowser } from './support/chromium';

const SCANS = 'console.scans';
const REPORTS = 'console.reports';
const ARCHIVED = 'events.ScanArchived';
const PRIORS = 'console.priors';
/** The module's `sequence.deadLetterChannel` in the apps that set one: SCANS and PRIORS share it. */
const SHARED = 'console.errors';
/** Long enough for any page update, never waited out when the page is right. */
const PAGE_WAIT_MS = 20_000;

/** The in-memory broker, refusing publishes to the channels in `refused` (a broker that says no). */
class RefusingTransport extends InMemoryTransport {
  readonly refused = new Set<string>();

  override async publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    options?: PublishOptions,
  ): Promise<void> {
    if (this.refused.has(channel)) throw new Error(`the broker refused ${channel} (test)`);
    return super.publish(channel, body, headers, options);
  }
}

/** Consumes scans; the test never sends a whole one. */
@Injectable()
class ScanIntake {
  readonly handled: string[] = [];

  @SequencedHandler({ channel: SCANS })
  handle(payload: ReassembledPayload): void {
    this.handled.push(payload.sequenceId);
  }
}

/** Consumes reports; fails while `failing`, as a handler whose database is down would. */
@Injectable()
class ReportIntake {
  failing = true;
  readonly handled: string[] = [];

  @ClaimCheck({ channel: REPORTS, handlerRetry: { attempts: 1 } })
  async handle(payload: ClaimedPayload): Promise<void> {
    const body = (await payload.toBuffer()).toString('utf8');
    if (this.failing) throw new Error(`the report store is down (test), report ${body}`);
    this.handled.push(body);
  }
}

/** Consumes prior studies: a second sequence channel, dead-lettering where scans do. */
@Injectable()
class PriorIntake {
  @SequencedHandler({ channel: PRIORS })
  async handle(payload: ReassembledPayload): Promise<void> {
    await payload.toBuffer();
  }
}

interface ConsoleApp {
  readonly app: INestApplication;
  readonly transport: RefusingTransport;
  /** http://127.0.0.1:<port>/sequence-admin/ */
  readonly url: string;
}

async function startApp(mutations = true, sharedDeadLetterChannel?: string): Promise<ConsoleApp> {
  const transport = new RefusingTransport();
  @Module({
    imports: [
      SequenceModule.forRoot({
        isGlobal: true,
        transport,
        ...(sharedDeadLetterChannel && {
          sequence: { deadLetterChannel: sharedDeadLetterChannel },
        }),
        outbox: {
          outboxEvents: {
            pollIntervalMs: 50,
            retry: { attempts: 1, baseDelayMs: 10, maxDelayMs: 10 },
          },
        },
      }),
      SequenceAdminModule.forRoot({ mutations }),
    ],
    providers: [ScanIntake, ReportIntake, ...(sharedDeadLetterChannel ? [PriorIntake] : [])],
  })
  class ConsoleTestModule {}

  const app = await NestFactory.create(ConsoleTestModule, { logger: false });
  await app.listen(0, '127.0.0.1');
  const { port } = (app.getHttpServer() as Server).address() as AddressInfo;
  return { app, transport, url: `http://127.0.0.1:${port}/sequence-admin/` };
}

/** Appends an event the broker refuses, and waits until its row is FAILED (one attempt). */
async function failOneOutboxRow(subject: ConsoleApp): Promise<{ id: string }> {
  subject.transport.refused.add(ARCHIVED);
  const outbox = subject.app.get(OutboxService);
  await outbox.transaction(async (tx) => {
    tx.publishEvent({
      type: 'ScanArchived',
      aggregateType: 'Scan',
      aggregateId: 'scan-0042',
      payload: { archive: 'cold' },
    });
  });
  await eventually(
    async () => (await outbox.failed('outbox_events')).length === 1,
    'the row to fail',
    PAGE_WAIT_MS,
  );
  const [failed] = await outbox.failed('outbox_events');
  return failed;
}

/** Opens the console and waits for its first complete read of the API. */
async function openConsole(page: Page, url: string): Promise<void> {
  await page.goto(url);
  await page.waitForSelector('body[data-refreshed]', { timeout: PAGE_WAIT_MS });
}

/** Clicks an action button, then the confirmation dialog's confirm button. */
async function clickAndConfirm(page: Page, button: ReturnType<Page['locator']>): Promise<void> {
  await button.click();
  const dialog = page.locator('dialog#confirm');
  await dialog.waitFor({ state: 'visible' });
  await dialog.locator('#confirm-ok').click();
}

describeWithChromium('the operator console in Chromium', () => {
  let subject: ConsoleApp;
  let browser: TestBrowser;

  // One browser for the block; each test opens the page afresh on an application of its own.
  beforeAll(async () => {
    browser = await launchChromium();
  });

  afterAll(async () => {
    await browser?.close();
  });

  beforeEach(async () => {
    browser.pageErrors.length = 0;
    subject = await startApp();
  });

  afterEach(async () => {
    await browser.page.goto('about:blank');
    await subject?.app.close();
  });

  it('is served by the module with a self-only Content-Security-Policy, and runs under it', async () => {
    const response = await fetch(subject.url);
    expect(response.status).toBe(200);
    expect(response.headers.get('content-security-policy')).toContain("default-src 'none'");
    expect(response.headers.get('content-security-policy')).toContain("script-src 'self'");
    const html = await response.text();
    // Nothing from another origin: every asset is a relative path the module serves.
    expect(html).not.toMatch(/(src|href)="(https?:)?\/\//);

    await openConsole(browser.page, subject.url.replace(/\/$/, '')); // redirected to the slash
    expect(new URL(browser.page.url()).pathname).toBe('/sequence-admin/');
    await browser.page.getByText('No problems').waitFor();
    await browser.screenshot('empty');
    expect(browser.pageErrors).toEqual([]);
  });

  it('lists an open sequence with its received and missing positions', async () => {
    const fragments = makeFragments('scan-0007', Buffer.alloc(5 * 1024, 7), 1024);
    for (const position of [1, 2, 4]) {
      const { body, headers } = fragments[position - 1];
      await subject.transport.publish(SCANS, body, headers);
    }
    const { page } = browser;
    await openConsole(page, subject.url);

    const row = page.locator('#sequences tr', { hasText: 'scan-0007' });
    await row.waitFor({ timeout: PAGE_WAIT_MS });
    const cells = await row.locator('th, td').allTextContents();
    expect(cells.slice(0, 5)).toEqual(['scan-0007', SCANS, '1–2, 4', '3, 5', '5']);
    // The page drew that from ranges, not from every position.
    const api = await fetch(`${subject.url}api/sequences`);
    const { items } = (await api.json()) as { items: Record<string, unknown>[] };
    expect(items.find((item) => item.sequenceId === 'scan-0007')).toMatchObject({
      received: [
        [1, 2],
        [4, 4],
      ],
      missing: [
        [3, 3],
        [5, 5],
      ],
      receivedCount: 3,
      missingCount: 2,
      truncated: false,
    });
    expect(await page.locator('#glance').textContent()).toContain('Open sequences1');
    await browser.screenshot('open-sequence');
    // What the page shows is what happened: the handler never ran.
    expect(subject.app.get(ScanIntake).handled).toEqual([]);
    expect(browser.pageErrors).toEqual([]);
  });

  it('shows a failed outbox row; retry publishes it and the row is gone', async () => {
    const received: Buffer[] = [];
    await subject.transport.subscribe(ARCHIVED, async (message) => {
      received.push(message.body);
      return { action: 'ack' };
    });
    const failed = await failOneOutboxRow(subject);
    const outbox = subject.app.get(OutboxService);

    const { page } = browser;
    await openConsole(page, subject.url);
    await page.locator('#problems').getByText('outbox').first().waitFor();
    const row = page.locator('#outbox tr', { hasText: failed.id });
    await row.waitFor({ timeout: PAGE_WAIT_MS });
    expect(await row.textContent()).toContain('the broker refused events.ScanArchived');
    await browser.screenshot('failed-outbox-row');

    subject.transport.refused.delete(ARCHIVED); // the broker is fixed; the operator retries
    await clickAndConfirm(page, row.getByRole('button', { name: 'Retry', exact: true }));

    await page
      .locator('#outbox')
      .getByText('No failed outbox row.')
      .waitFor({ timeout: PAGE_WAIT_MS });
    expect(await page.locator('#last-action').textContent()).toMatch(/1 changed/);
    await eventually(() => received.length === 1, 'the retried event to arrive', PAGE_WAIT_MS);
    expect(JSON.parse(received[0].toString('utf8'))).toMatchObject({
      type: 'ScanArchived',
      aggregateId: 'scan-0042',
    });
    expect(await outbox.failed('outbox_events')).toEqual([]);
    await browser.screenshot('outbox-row-retried');
    expect(browser.pageErrors).toEqual([]);
  });

  it('replays a dead letter, which then completes', async () => {
    const reports = subject.app.get(ReportIntake);
    await subject.app.get(ClaimCheckService).publish(REPORTS, Buffer.from('report-19'));
    await eventually(
      () => subject.transport.peek(`${REPORTS}.dlq`).length === 1,
      'the report to be dead-lettered',
      PAGE_WAIT_MS,
    );

    const { page } = browser;
    await openConsole(page, subject.url);
    const channel = page.locator('#dead-letters section', { hasText: REPORTS });
    await channel.waitFor({ timeout: PAGE_WAIT_MS });
    await channel.getByRole('button', { name: 'Show messages' }).click();
    const message = channel.locator('tbody tr', {
      has: page.getByRole('button', { name: 'Replay', exact: true }),
    });
    await message.waitFor({ timeout: PAGE_WAIT_MS });
    await browser.screenshot('dead-letter');

    reports.failing = false; // the report store is back
    await clickAndConfirm(page, message.getByRole('button', { name: 'Replay', exact: true }));
    await page
      .locator('#dead-letters')
      .getByText('No dead letter in any channel.')
      .waitFor({ timeout: PAGE_WAIT_MS });
    expect(await page.locator('#last-action').textContent()).toMatch(/1 changed/);
    await eventually(
      () => reports.handled.length === 1,
      'the replayed report to be handled',
      PAGE_WAIT_MS,
    );
    expect(reports.handled).toEqual(['report-19']);
    expect(subject.transport.peek(`${REPORTS}.dlq`)).toEqual([]);
    await browser.screenshot('dead-letter-replayed');
    expect(browser.pageErrors).toEqual([]);
  });

  it('says so when an action changes nothing: the dead letter was replayed meanwhile', async () => {
    await subject.app.get(ClaimCheckService).publish(REPORTS, Buffer.from('report-20'));
    await eventually(
      () => subject.transport.peek(`${REPORTS}.dlq`).length === 1,
      'the report to be dead-lettered',
      PAGE_WAIT_MS,
    );
    const { page } = browser;
    await openConsole(page, subject.url);
    const channel = page.locator('#dead-letters section', { hasText: REPORTS });
    await channel.getByRole('button', { name: 'Show messages' }).click({ timeout: PAGE_WAIT_MS });
    const replay = channel.getByRole('button', { name: 'Replay', exact: true });
    await replay.click({ timeout: PAGE_WAIT_MS });
    await page.locator('dialog#confirm').waitFor({ state: 'visible' });

    // Another operator replays it first, while this one's confirmation is open.
    subject.app.get(ReportIntake).failing = false;
    const other = await fetch(`${subject.url}api/dead-letters/${REPORTS}/replay`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-sequence-admin': '1' },
      body: JSON.stringify({ all: true }),
    });
    expect(((await other.json()) as { changed: number }).changed).toBe(1);
    await page.locator('#confirm-ok').click();

    const outcome = page.locator('#action-log li').first();
    await outcome.waitFor({ timeout: PAGE_WAIT_MS });
    expect(await outcome.getAttribute('data-outcome')).toBe('nothing');
    expect(await outcome.textContent()).toMatch(/nothing changed: /);
    await browser.screenshot('nothing-changed');
    expect(subject.app.get(ReportIntake).handled).toEqual(['report-20']);
  });
});

describeWithChromium('the operator console in Chromium, one shared dead-letter channel', () => {
  let subject: ConsoleApp;
  let browser: TestBrowser;

  beforeAll(async () => {
    browser = await launchChromium();
    subject = await startApp(true, SHARED);
  });

  afterAll(async () => {
    await browser?.close();
    await subject?.app.close();
  });

  it('offers no replay, since nothing says where each dead letter came from, and discards', async () => {
    // A fragment of a scan whose body fails its checksum: dead-lettered into the shared channel.
    const [fragment] = makeFragments('scan-7', Buffer.alloc(2_000, 7), 1_000);
    await subject.transport.publish(SCANS, Buffer.alloc(1_000), fragment.headers);
    await eventually(
      () => subject.transport.peek(SHARED).length === 1,
      'the fragment to be dead-lettered',
      PAGE_WAIT_MS,
    );

    const { page } = browser;
    await openConsole(page, subject.url);
    const channel = page.locator('#dead-letters section', { hasText: SHARED });
    await channel.waitFor({ timeout: PAGE_WAIT_MS });
    expect(await channel.locator('h3').textContent()).toContain(`shared by ${PRIORS}, ${SCANS}`);
    expect(await channel.textContent()).toMatch(
      /nothing in them says which channel each came from/,
    );
    await channel.getByRole('button', { name: 'Show messages' }).click();
    await channel
      .getByRole('button', { name: 'Discard', exact: true })
      .waitFor({ timeout: PAGE_WAIT_MS });
    expect(await channel.getByRole('button', { name: /Replay/ }).count()).toBe(0);
    await browser.screenshot('dead-letters-shared');

    await clickAndConfirm(page, channel.getByRole('button', { name: 'Discard all 1' }));
    await page
      .locator('#dead-letters')
      .getByText('No dead letter in any channel.')
      .waitFor({ timeout: PAGE_WAIT_MS });
    expect(subject.transport.peek(SHARED)).toEqual([]);
    expect(browser.pageErrors).toEqual([]);
  });
});

describeWithChromium('the operator console in Chromium, mutations off', () => {
  let subject: ConsoleApp;
  let browser: TestBrowser;

  // One browser for the block; each test opens the page afresh on an application of its own.
  beforeAll(async () => {
    browser = await launchChromium();
  });

  afterAll(async () => {
    await browser?.close();
  });

  beforeEach(async () => {
    browser.pageErrors.length = 0;
    subject = await startApp(false);
  });

  afterEach(async () => {
    await browser.page.goto('about:blank');
    await subject?.app.close();
  });

  it('shows the failed row with its actions disabled, and says why', async () => {
    const failed = await failOneOutboxRow(subject);
    const { page } = browser;
    await openConsole(page, subject.url);

    const note = page.locator('#mutations-note');
    await note.waitFor({ state: 'visible', timeout: PAGE_WAIT_MS });
    expect(await note.textContent()).toMatch(/Read-only: .*mutations option/);
    const row = page.locator('#outbox tr', { hasText: failed.id });
    await row.waitFor({ timeout: PAGE_WAIT_MS });
    const retry = row.getByRole('button', { name: 'Retry', exact: true });
    expect(await retry.isDisabled()).toBe(true);
    expect(await retry.getAttribute('aria-describedby')).toBe('mutations-note');
    await browser.screenshot('mutations-off');
    // Nothing was retried: the row is still FAILED.
    expect(await subject.app.get(OutboxService).failed('outbox_events')).toHaveLength(1);
    expect(browser.pageErrors).toEqual([]);
  });
});
