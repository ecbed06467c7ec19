import { Injectable } from '@nestjs/common';
import { ChannelRegistry } from '../kernel/channel.registry';
import { isRowId } from './admin-input';
import { BoxesReader, type BoxSide } from './boxes.reader';
import { ClaimsReader } from './claims.reader';
import { DeadLettersReader } from './dead-letters.reader';
import { ResequencerReader } from './resequencer.reader';
import { SequencesReader, sequenceView } from './sequences.reader';

/** One thing an id names. */
export interface FindMatch {
  readonly kind: 'sequence' | 'dead-letter' | 'claim' | 'resequencer-key' | 'outbox' | 'inbox';
  readonly summary: string;
  readonly [field: string]: unknown;
}

/** Header values that identify a message, matched against the id as well as the dead letter's own. */
const ID_HEADERS = [
  'x-sequence-id',
  'message-id',
  'x-message-id',
  'x-outbox-id',
  'x-resequence-key',
];

/**
 * Finds anything by id: an open sequence (on any channel consumed here), a dead letter (by its
 * id, sequence id or message id), a claim-check payload (by ref), a resequencer key (transfer
 * key), an outbox or inbox row. Each source is asked within its own bounds; one that cannot
 * answer (no dead-letter box, a store that cannot inspect) is left out.
 */
@Injectable()
export class FindReader {
  constructor(
    private readonly channels: ChannelRegistry,
    private readonly sequences: SequencesReader,
    private readonly deadLetters: DeadLettersReader,
    private readonly claims: ClaimsReader,
    private readonly resequencers: ResequencerReader,
    private readonly boxes: BoxesReader,
  ) {}

  /**
   * `deadLetters`: look among the dead letters even where reading them disturbs them (RabbitMQ
   * takes each and puts it back); where reading takes nothing, they are always looked at.
   */
  async find(id: string, options: { readonly deadLetters?: boolean } = {}): Promise<FindMatch[]> {
    const found = await Promise.all([
      this.findSequences(id),
      this.findDeadLetters(id, options.deadLetters === true),
      this.findClaim(id),
      this.findKeys(id),
      this.findRows('outbox', id),
      this.findRows('inbox', id),
    ]);
    return found.flat();
  }

  private async findSequences(id: string): Promise<FindMatch[]> {
    if (!this.sequences.canInspect) return [];
    const matches: FindMatch[] = [];
    for (const { channel } of this.channels.all()) {
      const item = await this.sequences.find(channel, id).catch(() => undefined);
      if (item) {
        matches.push({
          kind: 'sequence',
          summary:
            `open sequence on ${channel}: ${item.receivedPositions.length} fragment(s) received, ` +
            `${item.missingPositions.length} missing`,
          // As GET sequences gives it: positions as capped ranges, never whole arrays.
          ...sequenceView(item),
        });
      }
    }
    return matches;
  }

  private async findDeadLetters(id: string, asked: boolean): Promise<FindMatch[]> {
    const box = this.deadLetters.box;
    if (!box || !(asked || box.browseIsNonDestructive)) return [];
    const matches: FindMatch[] = [];
    // A dead-letter channel several channels share is read once, under its own name.
    for (const { name } of this.deadLetters.sources()) {
      const letters = await this.deadLetters
        .list(name, undefined, this.deadLetters.maxBatch)
        .catch(() => []);
      for (const letter of letters) {
        const named = ID_HEADERS.some((header) => headerIs(letter.headers[header], id));
        if (letter.id !== id && !named) continue;
        matches.push({
          kind: 'dead-letter',
          summary: `dead letter on ${letter.deadLetterChannel}: ${letter.reason}`,
          channel: letter.channel,
          deadLetterChannel: letter.deadLetterChannel,
          id: letter.id,
          reason: letter.reason,
          bytes: letter.bytes,
          deadLetteredAt: letter.deadLetteredAt,
          replays: letter.replays,
        });
      }
    }
    return matches;
  }

  private async findClaim(id: string): Promise<FindMatch[]> {
    const status = await this.claims.status(id).catch(() => undefined);
    if (!status || status.status === 'not-found') return [];
    return [
      {
        kind: 'claim',
        summary: `claim-check payload in ${status.store}: ${status.bytes} bytes, ${status.status}`,
        ...status,
      },
    ];
  }

  private async findKeys(id: string): Promise<FindMatch[]> {
    const matches: FindMatch[] = [];
    for (const name of this.resequencers.names()) {
      const state = await this.resequencers.key(name, id).catch(() => undefined);
      if (!state) continue;
      matches.push({
        kind: 'resequencer-key',
        summary:
          `resequencer ${name} key ${id}: next expected ${state.next}, ` +
          `${state.buffered.length} held, ${state.handOff} to deliver`,
        ...state,
      });
    }
    return matches;
  }

  /** Only an id a row can have is asked for (a store refuses the others, PostgreSQL a NUL). */
  private async findRows(side: BoxSide, id: string): Promise<FindMatch[]> {
    if (!isRowId(id)) return [];
    const rows = await this.boxes.find(side, id).catch(() => []);
    return rows.map(({ box, record }) => ({
      kind: side,
      summary: `${side} row in ${box}: ${record.type}, ${record.status}, ${record.attempts} attempt(s)`,
      box,
      id: record.id,
      type: record.type,
      status: record.status,
      attempts: record.attempts,
      lastError: record.lastError,
      createdAt: record.createdAt,
      completedAt: record.completedAt,
    }));
  }
}

/** Whether a header holds `id`: an absent or null one holds nothing, not the text "undefined". */
function headerIs(value: unknown, id: string): boolean {
  return (typeof value === 'string' || typeof value === 'number') && String(value) === id;
}
