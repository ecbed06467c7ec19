import {
  Body,
  Get,
  HttpCode,
  Inject,
  Param,
  Post,
  Query,
  Req,
  UseFilters,
  UseGuards,
} from '@nestjs/common';
import { AdminAccessGuard, AdminMutation } from './admin-access.guard';
import { AdminActions, type MutationAnswer } from './admin-actions';
import { AdminErrorFilter } from './admin-error.filter';
import { parseGapSince, parseIds, parseLimit, parseText } from './admin-input';
import { badRequest } from './admin.errors';
import { ADMIN_OPTIONS, type ResolvedAdminOptions } from './admin.options';
import { BOXES, BoxesReader, type BoxSide, type FailedRowItem } from './boxes.reader';
import type { BoxName } from '../ports/outbox-store.port';
import { ResequencerReader, type GapAnswer, type GapItem } from './resequencer.reader';

/** Resequencer gaps (skip, release) and failed outbox and inbox rows (retry, discard). */
@UseGuards(AdminAccessGuard)
@UseFilters(AdminErrorFilter)
export class RepairsController {
  constructor(
    @Inject(ADMIN_OPTIONS) private readonly options: ResolvedAdminOptions,
    private readonly resequencers: ResequencerReader,
    private readonly boxes: BoxesReader,
    private readonly actions: AdminActions,
  ) {}

  @Get('resequencer/gaps')
  async gaps(@Query('limit') limit: unknown): Promise<{ items: GapItem[] }> {
    return { items: await this.resequencers.gaps(parseLimit(limit, this.options.maxBatch)) };
  }

  @Post('resequencer/gaps/:resequencer/:key/skip')
  @HttpCode(200)
  @AdminMutation()
  async skip(
    @Param('resequencer') name: string,
    @Param('key') key: string,
    @Body() body: unknown,
    @Req() request: object,
  ): Promise<GapAnswer> {
    return this.gapAction('skip', name, key, body, request);
  }

  @Post('resequencer/gaps/:resequencer/:key/release')
  @HttpCode(200)
  @AdminMutation()
  async release(
    @Param('resequencer') name: string,
    @Param('key') key: string,
    @Body() body: unknown,
    @Req() request: object,
  ): Promise<GapAnswer> {
    return this.gapAction('release', name, key, body, request);
  }

  @Get('outbox/failed')
  outboxFailed(@Query('limit') limit: unknown): Promise<{ items: FailedRowItem[] }> {
    return this.failed('outbox', limit);
  }

  @Get('inbox/failed')
  inboxFailed(@Query('limit') limit: unknown): Promise<{ items: FailedRowItem[] }> {
    return this.failed('inbox', limit);
  }

  @Post('outbox/retry')
  @HttpCode(200)
  @AdminMutation()
  outboxRetry(@Body() body: unknown, @Req() request: object): Promise<MutationAnswer> {
    return this.act('outbox', 'retry', body, request);
  }

  @Post('outbox/discard')
  @HttpCode(200)
  @AdminMutation()
  outboxDiscard(@Body() body: unknown, @Req() request: object): Promise<MutationAnswer> {
    return this.act('outbox', 'discard', body, request);
  }

  @Post('inbox/retry')
  @HttpCode(200)
  @AdminMutation()
  inboxRetry(@Body() body: unknown, @Req() request: object): Promise<MutationAnswer> {
    return this.act('inbox', 'retry', body, request);
  }

  @Post('inbox/discard')
  @HttpCode(200)
  @AdminMutation()
  inboxDiscard(@Body() body: unknown, @Req() request: object): Promise<MutationAnswer> {
    return this.act('inbox', 'discard', body, request);
  }

  /** Skips the key's first gap, or all of them (release), recorded as `gap.<verb>`. */
  private gapAction(
    verb: 'skip' | 'release',
    name: string,
    key: string,
    body: unknown,
    request: object,
  ): Promise<GapAnswer> {
    const resequencer = parseText('resequencer', name);
    const target = parseText('key', key);
    const since = parseGapSince(body);
    return this.actions.recorded(
      request,
      `gap.${verb}`,
      name,
      () => [key],
      () =>
        verb === 'skip'
          ? this.resequencers.skip(resequencer, target, since)
          : this.resequencers.release(resequencer, target, since),
    );
  }

  private async failed(side: BoxSide, limit: unknown): Promise<{ items: FailedRowItem[] }> {
    return { items: await this.boxes.failed(side, parseLimit(limit, this.options.maxBatch)) };
  }

  private async act(
    side: BoxSide,
    verb: 'retry' | 'discard',
    body: unknown,
    request: object,
  ): Promise<MutationAnswer> {
    const ids = parseIds(body, this.options.maxBatch);
    const box = parseBox(side, body);
    return this.actions.recorded(
      request,
      `${side}.${verb}`,
      box ?? side,
      () => ids,
      () =>
        verb === 'retry' ? this.boxes.retry(side, ids, box) : this.boxes.discard(side, ids, box),
    );
  }
}

/**
 * The body's optional `channel`: the one box of the side its ids are taken in (a row of the
 * failed list names its box as `channel`); absent, the ids are taken in every box of the side.
 */
function parseBox(side: BoxSide, body: unknown): BoxName | undefined {
  const channel = (body as { channel?: unknown } | undefined)?.channel;
  if (channel === undefined) return undefined;
  const boxes = BOXES[side];
  if (typeof channel !== 'string' || !(boxes as readonly string[]).includes(channel)) {
    throw badRequest(`channel must be one of ${boxes.join(', ')} (the row's table)`);
  }
  return channel as BoxName;
}
