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
  optionalText,
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

  @Get('dead-letters/:channel')
  async list(
    @Param('channel') channel: string,
    @Query('reason') reason: unknown,
    @Query('limit') limit: unknown,
  ): Promise<{ items: DeadLetter[] }> {
    const items = await this.deadLetters.list(
      parseText('channel', channel),
      optionalText('reason', reason),
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
    const answer = await this.deadLetters.replay(parseText('channel', channel), selection);
    this.record(request, 'dead-letter.replay', channel, selection, answer);
    return answer;
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
    const answer = await this.deadLetters.discard(parseText('channel', channel), selection);
    this.record(request, 'dead-letter.discard', channel, selection, answer);
    return answer;
  }

  private record(
    request: object,
    action: string,
    channel: string,
    selection: DeadLetterSelection,
    answer: DeadLetterAnswer,
  ): void {
    const targets =
      selection.kind === 'ids'
        ? selection.ids
        : [...answer.done, ...answer.missing, ...answer.failed.map((failure) => failure.id)];
    this.actions.record(request, action, channel, targets, answer.changed);
  }
}
