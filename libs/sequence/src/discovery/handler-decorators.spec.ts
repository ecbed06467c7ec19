import {
  ClaimCheck,
  InboxHandler,
  Resequenced,
  SequencedHandler,
  SequenceOptionsError,
} from 'nest-sequence';

const decorators: Array<[string, () => MethodDecorator]> = [
  ['@SequencedHandler', () => SequencedHandler({ channel: 'scans' })],
  ['@ClaimCheck', () => ClaimCheck({ channel: 'studies' })],
  [
    '@Resequenced',
    () => Resequenced({ channel: 'transfers', gap: { timeoutMs: 1_000, policy: 'skip' } }),
  ],
  ['@InboxHandler', () => InboxHandler({ event: 'OrderPlaced' })],
];

describe('handler decorators', () => {
  it.each(decorators)(
    '%s on a getter is refused when the class is defined, naming it',
    (name, make) => {
      const define = () => {
        class Intake {
          @make()
          get analyse(): () => Promise<void> {
            return async () => {};
          }
        }
        return Intake;
      };
      expect(define).toThrow(SequenceOptionsError);
      expect(define).toThrow(
        `${name} on Intake.analyse is on an accessor (get or set), not a method: the module calls ` +
          'handler methods; put it on a method of the class',
      );
    },
  );

  it.each(decorators)('%s on a method marks it, as before', (_name, make) => {
    class Intake {
      @make()
      async analyse(): Promise<void> {}
    }
    expect(Reflect.getMetadataKeys(Intake.prototype.analyse)).toHaveLength(1);
  });
});
