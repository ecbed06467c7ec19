import { Readable } from 'node:stream';
import type { PutOptions, StoredPayload } from 'nest-sequence/ports';
import { bytes, eventually, FaultInjectingTransport } from '../support/sequence-test-app';
import {
  createClaimCheckTestApp,
  filesUnder,
  type ClaimCheckTestApp,
} from './claim-check-test-app';
import { FaultInjectingPayloadStore } from './fault-injecting.payload-store';

/** Holds each `put` until {@link release}: a slow upload. */
class HeldPuts extends FaultInjectingPayloadStore {
  started = 0;
  private opened!: () => void;
  private readonly gate = new Promise<void>((resolve) => (this.opened = resolve));

  release(): void {
    this.opened();
  }

  override async put(payload: Buffer | Readable, options: PutOptions): Promise<StoredPayload> {
    this.started++;
    await this.gate;
    return super.put(payload, options);
  }
}

/** A stream that gives a chunk every few ms and never ends on its own, counting what it gave. */
function endlessSource(): Readable & { bytesRead: number } {
  const source = new Readable({
    read() {
      setTimeout(() => {
        if (source.destroyed) return;
        source.bytesRead += 16 * 1024;
        source.push(bytes(16 * 1024, source.bytesRead));
      }, 2);
    },
  }) as Readable & { bytesRead: number };
  source.bytesRead = 0;
  return source;
}

/**
 * `ClaimCheckService.publish` with a `signal`: once it aborts, nothing more is read, stored or
 * sent, a stream given is destroyed, and the publish rejects with the signal's reason.
 */
describe('claim check: a publish aborted through its signal', () => {
  const CHANNEL = 'cc.test';
  let t: ClaimCheckTestApp;
  let store: HeldPuts | undefined;
  /** Records every publish attempt. */
  let link: FaultInjectingTransport;

  async function start(held = false): Promise<void> {
    t = await createClaimCheckTestApp({
      claimCheck: { inlineMaxBytes: 1024 },
      wrapStore: held ? (inner) => (store = new HeldPuts(inner)) : undefined,
      wrapTransport: (inner) => (link = new FaultInjectingTransport(inner)),
    });
  }

  afterEach(async () => {
    store?.release();
    store = undefined;
    await t.close();
  });

  it('stops a streamed upload: the stream is destroyed, nothing is stored, no ticket is sent', async () => {
    await start();
    const source = endlessSource();
    const controller = new AbortController();
    const reason = new Error('nobody wants it any more');
    const publishing = t.claimCheck.publish(CHANNEL, source, {}, controller.signal);
    await eventually(() => source.bytesRead > 64 * 1024, 'the upload under way');
    controller.abort(reason);
    await expect(publishing).rejects.toBe(reason);
    expect(source.destroyed).toBe(true);
    const readAtAbort = source.bytesRead;
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(source.bytesRead).toBe(readAtAbort);
    expect(await filesUnder(t.root)).toEqual([]);
    expect(link.attempts).toEqual([]); // no ticket
  });

  it('deletes a Buffer stored before the abort came, and sends no ticket', async () => {
    await start(true);
    const controller = new AbortController();
    const publishing = t.claimCheck.publish(CHANNEL, bytes(64 * 1024, 1), {}, controller.signal);
    await eventually(() => store!.started === 1, 'the upload under way');
    controller.abort(new Error('timed out'));
    store!.release();
    await expect(publishing).rejects.toThrow('timed out');
    expect(await filesUnder(t.root)).toEqual([]);
    expect(link.attempts).toEqual([]); // no ticket
  });

  it('reads nothing of a stream whose signal aborted before the call', async () => {
    await start();
    const source = endlessSource();
    const controller = new AbortController();
    controller.abort(new Error('too late'));
    await expect(t.claimCheck.publish(CHANNEL, source, {}, controller.signal)).rejects.toThrow(
      'too late',
    );
    expect(source.destroyed).toBe(true);
    expect(source.bytesRead).toBe(0);
    expect(link.attempts).toEqual([]); // no ticket
  });
});
