import { accessSync, constants, mkdirSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { ROOT } from './demo-process';

/** Debian's chromium (`apt-get install chromium`); CHROMIUM_PATH names another. */
export const CHROMIUM_PATH = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

/**
 * How the browser tests start Chromium (see DEVELOPERS.md): headless, without the sandbox (which
 * needs privileges a CI container lacks) and the GPU, and without anything that reaches the
 * network on its own (QUIC, first-run pages, background updates, component updates, sync). A
 * fresh profile (`--user-data-dir`) is added per launch, and removed after.
 */
export const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/** Where the browser tests write their screenshots (gitignored). */
export const SCREENSHOT_DIRECTORY = join(ROOT, 'test-output/console');

function chromiumMissing(): string | undefined {
  try {
    accessSync(CHROMIUM_PATH, constants.X_OK);
    return undefined;
  } catch {
    return `no Chromium at ${CHROMIUM_PATH}: install Debian's chromium (apt-get install chromium) or set CHROMIUM_PATH`;
  }
}

/**
 * `describe` for tests that drive Chromium. Without it: under CI (`CI=true`) the block fails,
 * naming the path; elsewhere it is skipped with a warning.
 */
export function describeWithChromium(name: string, body: () => void): void {
  const missing = chromiumMissing();
  if (!missing) {
    describe(name, body);
    return;
  }
  if (process.env.CI === 'true' || process.env.CI === '1') {
    describe(name, () => {
      it('needs Chromium', () => {
        throw new Error(missing);
      });
    });
    return;
  }
  console.warn(`skipping "${name}": ${missing}`);
  describe.skip(name, body);
}

/** A Chromium of the test's own, on a fresh profile. */
export interface TestBrowser {
  readonly context: BrowserContext;
  readonly page: Page;
  /** Every error the page logged or threw (a CSP violation, a failed script). */
  readonly pageErrors: string[];
  screenshot(name: string): Promise<string>;
  close(): Promise<void>;
}

export async function launchChromium(): Promise<TestBrowser> {
  const profile = await mkdtemp(join(tmpdir(), 'console-chromium-'));
  let context: BrowserContext;
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM_PATH,
      args: CHROMIUM_ARGS,
      headless: true,
      viewport: { width: 1280, height: 900 },
    });
  } catch (error) {
    await rm(profile, { recursive: true, force: true });
    throw error;
  }
  const page = context.pages()[0] ?? (await context.newPage());
  const pageErrors: string[] = [];
  page.on('pageerror', (error) => pageErrors.push(error.message));
  page.on('console', (message) => {
    if (message.type() === 'error') pageErrors.push(message.text());
  });
  page.on('response', (response) => {
    if (response.status() >= 400) pageErrors.push(`${response.status()} ${response.url()}`);
  });
  mkdirSync(SCREENSHOT_DIRECTORY, { recursive: true });
  return {
    context,
    page,
    pageErrors,
    async screenshot(name) {
      const path = join(SCREENSHOT_DIRECTORY, `${name}.png`);
      // From the top: the sticky header then sits where a reader sees it.
      await page.evaluate('window.scrollTo(0, 0)');
      await page.screenshot({ path, fullPage: true });
      return path;
    },
    async close() {
      try {
        await context.close();
      } finally {
        await rm(profile, { recursive: true, force: true });
      }
    },
  };
}
