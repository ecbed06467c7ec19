import { BadRequestException, createParamDecorator, type ExecutionContext } from '@nestjs/common';
import type { SequenceContext } from 'nest-sequence/microservices';

/** The header the study's metadata travels in, as JSON. */
export const STUDY_HEADER = 'x-study';

/**
 * The study's metadata: the `x-study` header of the message, parsed. Give it a ValidationPipe
 * with `validateCustomDecorators: true` to check it against a DTO. A missing header or one that is
 * not JSON is refused (a BadRequestException, which the server dead-letters as
 * `invalid-payload`), like a DTO that does not validate.
 */
export const StudyMetadata = createParamDecorator((_data: unknown, context: ExecutionContext) => {
  const raw = context.switchToRpc().getContext<SequenceContext>().getHeaders()[STUDY_HEADER];
  if (typeof raw !== 'string') {
    throw new BadRequestException(`the ${STUDY_HEADER} header is missing`);
  }
  try {
    return JSON.parse(raw) as unknown;
  } catch {
    throw new BadRequestException(`the ${STUDY_HEADER} header is not JSON`);
  }
});
