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
import type { DeadLetter } from '../ports/dead-letter-box.port';
import { AdminAccessGuard, AdminMutation } from './admin-access.guard';
import { AdminActions } from './admin-actions';
import { AdminErrorFilter } from './admin-error.filter';
import {
  optionalReason,
  parseLimit,
  parseSelection,
  parseText,
  type DeadLetterSelection,
} from './admin-input';
import { ADMIN_OPTIONS, type ResolvedAdminOptions } from './admin.options';
import {
  DeadLettersReader,
  type DeadLetterAnswer,
  type DeadLetterChannelSummary,
} from './dead-letters.reader';

/** Dead letters per channel: browse, grouped by reason; replay or discard. */
@UseGuards(AdminAccessGuard)
@UseFilters(AdminErrorFilter)
export class DeadLettersController {
  constructor(
    @Inject(ADMIN_OPTIONS) private readonly options: ResolvedAdminOptions,
    private readonly deadLetters: DeadLettersReader,
    private readonly actions: AdminActions,
  ) {}

  @Get('dead-letters')
  async channels(): Promise<{ channels: DeadLetterChannelSummary[] }> {
    return { channels: await this.deadLetters.summary() };
  }

  /** One channel grouped by reason: reads its dead letters (at most once per 30 s). */
  @Get('dead-letters/:channel/reasons')
  reasons(@Param('channel') channel: string): Promise<DeadLetterChannelSummary> {
    return this.deadLetters.channelReasons(parseText('channel', channel));
  }

  /** `?reason=` (empty) lists those without a reason; no `reason`, all of them. */
  @Get('dead-letters/:channel')
  async list(
    @Param('channel') channel: string,
    @Query('reason') reason: unknown,
    @Query('limit') limit: unknown,
  ): Promise<{ items: DeadLetter[] }> {
    const items = await this.deadLetters.list(
      parseText('channel', channel),
      optionalReason(reason),
      parseLimit(limit, this.options.maxBatch),
    );
    return { items };
  }

  @Post('dead-letters/:channel/replay')
  @HttpCode(200)
  @AdminMutation()
  async replay(
    @Param('channel') channel: string,
    @Body() body: unknown,
    @Req() request: object,
  ): Promise<DeadLetterAnswer> {
    const selection = parseSelection(body, this.options.maxBatch);
    return this.recorded(request, 'dead-letter.replay', channel, selection, () =>
      this.deadLetters.replay(parseText('channel', channel), selection),
    );
  }

  @Post('dead-letters/:channel/discard')
  @HttpCode(200)
  @AdminMutation()
  async discard(
    @Param('channel') channel: string,
    @Body() body: unknown,
    @Req() request: object,
  ): Promise<DeadLetterAnswer> {
    const selection = parseSelection(body, this.options.maxBatch);
    return this.recorded(request, 'dead-letter.discard', channel, selection, () =>
      this.deadLetters.discard(parseText('channel', channel), selection),
    );
  }

  /** Runs the action and records it as `admin.action`, failed or not (then with its error). */
  private recorded(
    request: object,
    action: string,
    channel: string,
    selection: DeadLetterSelection,
    run: () => Promise<DeadLetterAnswer>,
  ): Promise<DeadLetterAnswer> {
    const targets = (answer: DeadLetterAnswer | undefined): readonly string[] =>
      selection.kind === 'ids'
        ? selection.ids
        : answer
          ? [
              ...answer.done,
              ...answer.missing,
              ...answer.failed.map((failed) => failed.id),
              ...(answer.uncertain ?? []).map((uncertain) => uncertain.id),
            ]
          : [];
    return this.actions.recorded(request, action, channel, targets, run);
  }
}
