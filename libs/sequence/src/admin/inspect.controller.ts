import { Get, Param, Query, UseFilters, UseGuards } from '@nestjs/common';
import { AdminAccessGuard } from './admin-access.guard';
import { AdminErrorFilter } from './admin-error.filter';
import { optionalText, parseLimit, parseText } from './admin-input';
import { ADMIN_OPTIONS, type ResolvedAdminOptions } from './admin.options';
import { ClaimsReader, type ClaimStatus } from './claims.reader';
import { FindReader, type FindMatch } from './find.reader';
import { OverviewReader, type Overview } from './overview.reader';
import { SequencesReader, type SequenceView } from './sequences.reader';
import { Inject } from '@nestjs/common';

/** The read-only routes: overview, open sequences, find by id, claim-check status. */
@UseGuards(AdminAccessGuard)
@UseFilters(AdminErrorFilter)
export class InspectController {
  constructor(
    @Inject(ADMIN_OPTIONS) private readonly options: ResolvedAdminOptions,
    private readonly overviewReader: OverviewReader,
    private readonly sequences: SequencesReader,
    private readonly finder: FindReader,
    private readonly claims: ClaimsReader,
  ) {}

  @Get('overview')
  overview(): Promise<Overview> {
    return this.overviewReader.overview();
  }

  @Get('sequences')
  async listSequences(
    @Query('channel') channel: unknown,
    @Query('limit') limit: unknown,
  ): Promise<{ items: SequenceView[] }> {
    const items = await this.sequences.list(
      optionalText('channel', channel),
      parseLimit(limit, this.options.maxBatch),
    );
    return { items };
  }

  @Get('sequences/:channel/:sequenceId')
  sequence(
    @Param('channel') channel: string,
    @Param('sequenceId') sequenceId: string,
  ): Promise<SequenceView> {
    return this.sequences.one(parseText('channel', channel), parseText('sequenceId', sequenceId));
  }

  /** `?deadLetters=1` looks among RabbitMQ's dead letters too (a read that redelivers them). */
  @Get('find/:id')
  async find(
    @Param('id') id: string,
    @Query('deadLetters') deadLetters: unknown,
  ): Promise<{ matches: FindMatch[] }> {
    const options = { deadLetters: deadLetters === '1' || deadLetters === 'true' };
    return { matches: await this.finder.find(parseText('id', id), options) };
  }

  @Get('claims/:ref')
  claim(@Param('ref') ref: string): Promise<ClaimStatus> {
    return this.claims.status(parseText('ref', ref));
  }
}
