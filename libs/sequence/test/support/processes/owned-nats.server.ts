import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { OwnedServerProcess, sparePort } from './server-process';

/**
 * A `nats-server` with JetStream that the test owns, on a spare loopback port with its own store
 * directory: for a larger `max_payload` than the machine's server, and for crashing, pausing and
 * restarting without touching the shared one. JetStream keeps its streams in the store directory,
 * so a restart after SIGKILL finds what the server had acknowledged.
 */
export class OwnedNatsServer extends OwnedServerProcess {
  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  static async start(
    options: { maxPayloadBytes?: number; configLines?: readonly string[] } = {},
  ): Promise<OwnedNatsServer> {
    const server = new OwnedNatsServer(
      await sparePort(),
      mkdtempSync(join(tmpdir(), 'nseq-nats-')),
    );
    const lines = [
      `listen: 127.0.0.1:${server.port}`,
      `jetstream { store_dir: ${JSON.stringify(join(server.dir, 'store'))} }`,
    ];
    if (options.maxPayloadBytes) lines.push(`max_payload: ${options.maxPayloadBytes}`);
    lines.push(...(options.configLines ?? []));
    writeFileSync(server.config, lines.join('\n'));
    await server.restart();
    return server;
  }

  private get config(): string {
    return join(this.dir, 'nats.conf');
  }

  /**
   * Removes the message blocks of `stream` (of the default account) while the server is stopped:
   * what a crash between removing a work-queue stream's last block and writing the next leaves
   * on some servers (see docs/transports.md), whose stream then comes back with its sequence at 0.
   */
  removeMessageBlocks(stream: string): void {
    const blocks = join(this.dir, 'store', 'jetstream', '$G', 'streams', stream, 'msgs');
    rmSync(blocks, { recursive: true, force: true });
  }

  restart(): Promise<void> {
    return this.launch(process.env.NATS_SERVER_BIN ?? 'nats-server', ['-c', this.config]);
  }
}
