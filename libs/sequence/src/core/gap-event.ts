/**
 * A gap outcome, reported by the instance that delivered it (`onGap`, `ResequencerService.onGap`)
 * and recorded on the dead-letter channel:
 * - `alert`: `key` has waited for `expected` longer than `gap.timeoutMs`, with `buffered` events
 *   behind it (policy `'alert'`: it keeps waiting);
 * - `skipped`: sequences `from`..`to` of `key` were given up (policy `'skip'`);
 * - `dead-lettered`: event `seq` of `key` was moved to the dead-letter channel, unreleased
 *   (policy `'dead-letter'`, while `expected` was missing).
 */
export type GapEvent =
  | {
      readonly type: 'alert';
      readonly resequencer: string;
      readonly key: string;
      readonly expected: number;
      readonly buffered: number;
      readonly gapSince: number;
    }
  | {
      readonly type: 'skipped';
      readonly resequencer: string;
      readonly key: string;
      readonly from: number;
      readonly to: number;
    }
  | {
      readonly type: 'dead-lettered';
      readonly resequencer: string;
      readonly key: string;
      readonly seq: number;
      readonly expected: number;
    };
