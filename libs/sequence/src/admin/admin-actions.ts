import { Injectable } from '@nestjs/common';
import { errorMessage } from '../core/errors/caught';
import { SequenceEvents } from '../observability/lifecycle-events';

/** A mutation's answer: how many targets it changed, and a sentence saying so (or why not). */
export interface MutationAnswer {
  readonly changed: number;
  readonly message: string;
}

interface UserRequest {
  readonly user?: unknown;
}

/** Who the app's guard says made the request (`request.user`), as one string. */
export function actorOf(request: UserRequest): string | undefined {
  const user = request.user;
  if (typeof user === 'string') return user;
  if (typeof user !== 'object' || user === null) return undefined;
  const named = user as Record<string, unknown>;
  for (const field of ['id', 'username', 'name', 'email', 'sub']) {
    const value = named[field];
    if (typeof value === 'string' || typeof value === 'number') return String(value);
  }
  return undefined;
}

/** Records every admin action as an `admin.action` lifecycle event. */
@Injectable()
export class AdminActions {
  constructor(private readonly events: SequenceEvents) {}

  /**
   * Runs an action and records it as `admin.action`, failed or not (then with its error).
   * `targets` names what it addressed, from its answer when there is one.
   */
  async recorded<T extends { readonly changed: number }>(
    request: UserRequest,
    action: string,
    channel: string,
    targets: (answer: T | undefined) => readonly string[],
    run: () => Promise<T>,
  ): Promise<T> {
    let answer: T | undefined;
    let failure: unknown;
    try {
      answer = await run();
      return answer;
    } catch (error) {
      failure = error;
      throw error;
    } finally {
      const error = answer === undefined ? errorMessage(failure) : undefined;
      this.record(request, action, channel, targets(answer), answer?.changed ?? 0, error);
    }
  }

  record(
    request: UserRequest,
    action: string,
    channel: string,
    targets: readonly string[],
    changed: number,
    error?: string,
  ): void {
    this.events.emit(() => ({
      type: 'admin.action',
      at: Date.now(),
      channel,
      action,
      targets: [...targets],
      changed,
      actor: actorOf(request),
      ...(error === undefined ? {} : { error }),
    }));
  }
}
