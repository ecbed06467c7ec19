// Copied into the applications of test/package.e2e-spec.ts, which install nest-sequence from its
// tarball: there, 'nest-sequence' is the installed package.
import { createHash, randomBytes } from 'node:crypto';
import { Injectable } from '@nestjs/common';
import { ReassembledPayload, SequencedHandler, SplitterService } from 'nest-sequence';

export const SCAN_CHANNEL = process.env.SCAN_CHANNEL || 'scans';

export interface RoundTrip {
  readonly sentSha256: string;
  readonly sentBytes: number;
  readonly fragments: number;
  readonly receivedSha256: string;
  readonly receivedBytes: number;
}

interface Arrival {
  readonly sha256: string;
  readonly bytes: number;
}

/** Sends one scan of random bytes as a sequence, and hashes it as its handler reads it back. */
@Injectable()
export class ScanRoundTrip {
  private arrived!: (arrival: Arrival) => void;
  private readonly arrival = new Promise<Arrival>((resolve) => (this.arrived = resolve));

  constructor(private readonly splitter: SplitterService) {}

  @SequencedHandler({ channel: SCAN_CHANNEL })
  async receive(scan: ReassembledPayload): Promise<void> {
    const hash = createHash('sha256');
    for await (const chunk of scan.stream()) hash.update(chunk as Buffer);
    this.arrived({ sha256: hash.digest('hex'), bytes: scan.bytes });
  }

  async run(bytes: number): Promise<RoundTrip> {
    const scan = randomBytes(bytes);
    const sentSha256 = createHash('sha256').update(scan).digest('hex');
    const receipt = await this.splitter.send(SCAN_CHANNEL, scan);
    const arrival = await this.arrival;
    return {
      sentSha256,
      sentBytes: scan.length,
      fragments: receipt.fragments,
      receivedSha256: arrival.sha256,
      receivedBytes: arrival.bytes,
    };
  }
}

/** Prints the round trip for the test to read, and fails the process unless it came back whole. */
export function report(roundTrip: RoundTrip): void {
  console.log(`round trip ${JSON.stringify(roundTrip)}`);
  const whole =
    roundTrip.receivedSha256 === roundTrip.sentSha256 &&
    roundTrip.receivedBytes === roundTrip.sentBytes;
  process.exitCode = whole ? 0 : 1;
}
