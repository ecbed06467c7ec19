import type { HandlerContext } from '../kernel/handler-call';
import { AsyncLocalStorage } from 'node:async_hooks';
import { setMaxListeners } from 'node:events';
import { Readable } from 'node:stream';
import {
  Inject,
  Injectable,
  Logger,
  type NestInterceptor,
  type OnApplicationShutdown,
  type OnModuleDestroy,
  type OnModuleInit,
} from '@nestjs/common';
import { EXCEPTION_FILTERS_METADATA, INTERCEPTORS_METADATA } from '@nestjs/common/constants';
import {
  DiscoveryService,
  ExternalContextCreator,
  MetadataScanner,
  ModulesContainer,
} from '@nestjs/core';
import {
  fromEvent,
  isObservable,
  lastValueFrom,
  merge,
  NEVER,
  takeUntil,
  tap,
  type Observable,
  type Subscription as RxSubscription,
} from 'rxjs';
import { ClaimCheckHandlerKind } from '../claim-check/claim-check-handler.kind';
import { isRecordSource } from '../core/payload-source';
import { destroySource } from '../core/refused-source';
import { ClaimCheckService } from '../claim-check/claim-check.service';
import type { ClaimedPayload } from '../claim-check/claimed-payload';
import type { ChannelBinding } from '../kernel/channel-binding';
import { instanceMethods } from '../kernel/decorated-methods';
import { SequenceLifecycle } from '../kernel/sequence.lifecycle';
import { RESOLVED_OPTIONS, SEQUENCE_TRANSPORT } from '../kernel/tokens';
import type { ResolvedOptions } from '../options/resolved-options';
import type { InboundMessage, Subscription, Transport } from '../ports/transport.port';
import { ResequencedHandlerKind } from '../resequencer/resequenced-handler.kind';
import {
  ATTACH_RUNTIME,
  isRuntimeTarget,
  type ConsumerSpec,
  type ControllerMethod,
  type ParamsReader,
  type PipelineOutcome,
  type PipelineStage,
  type SequenceRuntime,
} from './sequence-runtime';
import { SequenceRecord } from './sequence.record';

/** Per call through the pipeline: how far it got, and what it threw. */
interface CallState {
  stage: PipelineStage;
  thrown?: unknown;
  /** The call's `@Ctx()` signal: aborted when the call is abandoned (past handlerTimeoutMs). */
  signal?: AbortSignal;
}

/**
 * Attaches this module's {@link SequenceRuntime} to the application's `SequenceServer`s (Nest's
 * RPC target registry lists every microservice server, before or after this module starts) and
 * `SequenceClient`s (providers, as `ClientsModule` registers them). Imports nothing of
 * `@nestjs/microservices`: an application without it pays nothing.
 */
@Injectable()
export class RuntimeBridge
  implements SequenceRuntime, OnModuleInit, OnModuleDestroy, OnApplicationShutdown
{
  private readonly logger = new Logger('SequenceModule');
  private readonly calls = new AsyncLocalStorage<CallState>();
  /**
   * Aborted at application shutdown, once the module's waits for the calls in progress are over
   * (the consumers', the resequencer drains', the sweeps'): the Observables those calls still
   * run are unsubscribed (see {@link lastValueUntilAborted}). Every such call listens on it.
   */
  private readonly shutdown = unlimitedListeners(new AbortController());
  private readonly deliveries = new AsyncLocalStorage<InboundMessage>();
  private targets: RxSubscription | undefined;
  private readonly bound = new WeakMap<ConsumerSpec, ChannelBinding[]>();

  constructor(
    @Inject(SEQUENCE_TRANSPORT) readonly transport: Transport,
    private readonly modules: ModulesContainer,
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly contexts: ExternalContextCreator,
    private readonly lifecycle: SequenceLifecycle,
    private readonly payloads: ClaimCheckHandlerKind,
    private readonly ordered: ResequencedHandlerKind,
    private readonly claimCheck: ClaimCheckService,
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
  ) {
    // From construction, not init: a hybrid app may start its microservices before its init. A
    // replay: servers created before this module, and those created after.
    this.targets = this.modules.getRpcTargetRegistry<unknown>().subscribe((target) => {
      if (isRuntimeTarget(target)) target[ATTACH_RUNTIME](this);
    });
    // Clients too, those made already (`ClientsModule.register` makes them as it is imported):
    // the `onModuleInit` of a module initialised before this one (listed before SequenceModule)
    // may already call a client's `connect()` or `emit()`.
    this.attachClients();
  }

  get shutdownTimeoutMs(): number {
    return this.options.shutdownTimeoutMs;
  }

  /** Attaches the clients made since construction too (`ClientsModule.registerAsync`'s). */
  onModuleInit(): void {
    this.attachClients();
  }

  private attachClients(): void {
    for (const wrapper of this.discovery.getProviders()) {
      const instance: unknown = wrapper.instance;
      if (isRuntimeTarget(instance)) instance[ATTACH_RUNTIME](this);
    }
  }

  onModuleDestroy(): void {
    this.targets?.unsubscribe();
  }

  onApplicationShutdown(): void {
    this.shutdown.abort(new Error('the module is shutting down'));
  }

  methodsWith(metadataKey: string): ControllerMethod[] {
    const found: ControllerMethod[] = [];
    const controllers = this.discovery.getControllers();
    for (const { wrapper, ...target } of instanceMethods(controllers, this.scanner)) {
      if (Reflect.getMetadata(metadataKey, target.method) === undefined) continue;
      found.push({
        ...target,
        singleton: wrapper.isDependencyTreeStatic() && !wrapper.isTransient,
      });
    }
    return found;
  }

  pipeline(
    target: ControllerMethod,
    paramsMetadataKey: string,
    params: ParamsReader,
  ): (...args: unknown[]) => Promise<PipelineOutcome> {
    const calls = this.calls;
    const { method } = target;
    // Nest reads guards, interceptors and pipes off the function it calls: a stand-in that notes
    // the method was reached carries the method's metadata and name.
    const standIn = function (this: unknown, ...args: unknown[]): unknown {
      const state = calls.getStore();
      if (state) state.stage = 'handler';
      const result = method.apply(this, args);
      if (state?.signal) destroyIfAbandoned(result, state.signal);
      return result;
    };
    Object.defineProperty(standIn, 'name', { value: target.methodName });
    for (const key of Reflect.getMetadataKeys(method) as unknown[]) {
      Reflect.defineMetadata(key, Reflect.getMetadata(key, method) as unknown, standIn);
    }
    // The innermost interceptor (method-level ones run last): past it, Nest applies the pipes,
    // then calls the method. Whatever fails from here until the method runs is a pipe's.
    const pipesStart: NestInterceptor = {
      intercept(_context, next) {
        const state = calls.getStore();
        if (state) state.stage = 'pipes';
        return next.handle();
      },
    };
    const interceptors = (Reflect.getMetadata(INTERCEPTORS_METADATA, standIn) ?? []) as unknown[];
    Reflect.defineMetadata(INTERCEPTORS_METADATA, [...interceptors, pipesStart], standIn);
    const contexts = this.controllerContexts();
    // Without the exception filters: the call fails with what was thrown, at the stage it was.
    const invoke = contexts.create(
      target.instance,
      standIn,
      target.methodName,
      paramsMetadataKey,
      params,
      undefined,
      undefined,
      { guards: true, interceptors: true, filters: false },
      'rpc',
    );
    const filter = this.exceptionFilters(target, contexts);
    return (...args) => {
      const state: CallState = { stage: 'before-pipes', signal: signalOf(args[1]) };
      return calls.run(state, async (): Promise<PipelineOutcome> => {
        try {
          return { ok: true, value: await invoke(...args) };
        } catch (error) {
          state.thrown = error;
          try {
            // An exception filter that answers with a value settles the call, as in any Nest app.
            return { ok: true, value: await filter(...args) };
          } catch (filtered) {
            return { ok: false, error, stage: state.stage, filtered };
          }
        }
      });
    };
  }

  /**
   * The exception filters of `target` (global, its class's and its method's), as Nest applies
   * them: a stand-in that rethrows what the call threw, called with the call's arguments, carrying
   * the method's filters. No guards, no interceptors, and no parameters, so no pipes: it is given
   * a method name the class does not have (Nest caches parameters by class and method name).
   * Rejects with what the filters made of the error; an Observable they answer with (`throwError`,
   * as Nest's RPC filters give) is awaited to its last value.
   */
  private exceptionFilters(
    target: ControllerMethod,
    contexts: ExternalContextCreator,
  ): (...args: unknown[]) => Promise<unknown> {
    const calls = this.calls;
    const rethrow = (): never => {
      throw calls.getStore()?.thrown;
    };
    const filters = Reflect.getMetadata(EXCEPTION_FILTERS_METADATA, target.method) as unknown;
    if (filters !== undefined) Reflect.defineMetadata(EXCEPTION_FILTERS_METADATA, filters, rethrow);
    const handle = contexts.create(
      target.instance,
      rethrow,
      `${target.methodName} (exception filters)`,
      undefined,
      undefined,
      undefined,
      undefined,
      { guards: false, interceptors: false, filters: true },
      'rpc',
    );
    return async (...args) => {
      const answer: unknown = await handle(...args);
      return isObservable(answer) ? lastValueFrom(answer, { defaultValue: undefined }) : answer;
    };
  }

  /**
   * Nest's ExternalContextCreator, finding a controller's module too: it looks for the class
   * among providers only, and without the module, guards, interceptors and pipes given as classes
   * cannot be resolved. Its public `getContextModuleKey` is overridden on a child object; the
   * shared instance is left as it is.
   */
  private controllerContexts(): ExternalContextCreator {
    const modules = this.modules;
    const shared = this.contexts;
    const calls = this.calls;
    const shutdown = this.shutdown.signal;
    return Object.create(shared, {
      // The call settles with the last value of an Observable (the handler's, or an
      // interceptor's): one that completes without a value (work done, nothing to answer)
      // succeeds with none, where Nest's lastValueFrom would fail with EmptyError.
      transformToResult: {
        value(result: unknown): Promise<unknown> {
          return isObservable(result)
            ? lastValueUntilAborted(result, calls.getStore()?.signal, shutdown)
            : Promise.resolve(result);
        },
      },
      // The guards' run is a stage of its own: what one throws is a refusal (see refusalOf).
      createGuardsFn: {
        value(
          this: ExternalContextCreator,
          ...args: Parameters<ExternalContextCreator['createGuardsFn']>
        ) {
          const canActivate = shared.createGuardsFn.apply(this, args) as
            ((callArgs: unknown[]) => Promise<void>) | null;
          if (!canActivate) return null;
          return async (callArgs: unknown[]) => {
            const state = calls.getStore();
            if (state) state.stage = 'guards';
            await canActivate(callArgs);
            if (state) state.stage = 'before-pipes';
          };
        },
      },
      getContextModuleKey: {
        value(classRef: (abstract new (...args: never[]) => unknown) | undefined): string {
          for (const [key, moduleRef] of modules.entries()) {
            if (classRef && moduleRef.controllers.has(classRef)) return key;
          }
          return shared.getContextModuleKey(classRef);
        },
      },
    }) as ExternalContextCreator;
  }

  currentMessage(): InboundMessage | undefined {
    return this.deliveries.getStore();
  }

  async consume(specs: readonly ConsumerSpec[]): Promise<boolean> {
    const bindings = specs.flatMap((spec) => {
      // Bound once per spec: consuming it again (a listen() tried again) reuses its bindings.
      let bound = this.bound.get(spec);
      if (!bound) {
        bound = this.bind(spec);
        this.bound.set(spec, bound);
      }
      return bound;
    });
    const consuming = await this.lifecycle.addBindings(bindings);
    if (consuming || bindings.length === 0) return consuming;
    const handlers = bindings.map((binding) => `${binding.definedBy} on ${binding.channel}`);
    this.logger.warn(
      `SequenceServer listened after SequenceModule's shutdown began: its handlers are not ` +
        `subscribed (${handlers.join(', ')}); no handler consumes once the shutdown began`,
    );
    return false;
  }

  private bind(spec: ConsumerSpec): ChannelBinding[] {
    const [className, methodName] = splitDefinedBy(spec.definedBy);
    const bindings =
      spec.kind === 'payloads'
        ? this.payloads.bind({
            className,
            methodName,
            options: spec.options,
            call: (payload, context) =>
              spec.handler(payload as ClaimedPayload, context as HandlerContext),
          })
        : this.ordered.bind({
            className,
            methodName,
            options: spec.definition,
            call: (event, context) =>
              spec.handler(event as Parameters<typeof spec.handler>[0], context as HandlerContext),
          });
    return bindings.map((binding) => this.tracked(binding, spec.refused));
  }

  /**
   * The binding, with the message it is taking kept for `currentMessage()`, and `refused` told of
   * each message it dead-letters.
   */
  private tracked(binding: ChannelBinding, refused?: ConsumerSpec['refused']): ChannelBinding {
    return {
      ...binding,
      receive: async (message) => {
        const disposition = await this.deliveries.run(message, () => binding.receive(message));
        if (disposition.action === 'dead-letter' && refused) {
          // Never in the way of the settlement: the reply is a courtesy to the caller.
          await refused(message, disposition.reason).catch(() => undefined);
        }
        return disposition;
      },
    };
  }

  publish: SequenceRuntime['publish'] = (channel, payload, options, signal) =>
    this.claimCheck.publish(channel, payload, { ...options, mode: 'auto' }, signal);

  openReplyChannel(
    definedBy: string,
    handler: (payload: ClaimedPayload, signal: AbortSignal) => unknown,
    readTimeoutMs: number,
  ): Promise<Subscription> | undefined {
    const open = this.transport.openReplyChannel?.bind(this.transport);
    if (!open) return undefined;
    const [className, methodName] = splitDefinedBy(definedBy);
    let binding: ChannelBinding | undefined;
    return open(async (message) => {
      // Nobody publishes to the channel before it is named, and it is named once open resolves.
      if (!binding) return { action: 'requeue', delayMs: 100, reason: 'not ready' };
      return binding.receive(message);
    }).then((subscription) => {
      [binding] = this.payloads
        .bind({
          className,
          methodName,
          // The module's handlerTimeoutMs and handlerRetry are for its handlers: a reply is read
          // once, within the client's own limit, by when its caller has had an answer anyway.
          options: {
            channel: subscription.channel,
            handlerTimeoutMs: readTimeoutMs,
            handlerRetry: { attempts: 1 },
          },
          call: (payload, context) =>
            handler(payload as ClaimedPayload, (context as HandlerContext).signal),
        })
        .map((bound) => this.tracked(bound));
      this.logger.debug(`${definedBy} receives replies on ${subscription.channel}`);
      return subscription;
    });
  }
}

/**
 * The signal of a call's context (`SequenceContext.getSignal()`), if it has one. Looked up by
 * name: SequenceContext extends a class of `@nestjs/microservices`, an optional peer, and this
 * file is loaded by every application of the module.
 */
function signalOf(context: unknown): AbortSignal | undefined {
  const getSignal = (context as { getSignal?: unknown } | undefined)?.getSignal;
  return typeof getSignal === 'function' ? (getSignal.call(context) as AbortSignal) : undefined;
}

/**
 * The last value of `source`, or undefined (its error, rejected). Unsubscribed once the call's
 * `signal` aborts (resolving with what it had: an abandoned call's result is ignored), or once
 * `shutdown` does: an Observable of a call the module no longer waits for (an interval, a socket)
 * must not run on, nor keep the process open. The call then never settles, as a handler's Promise
 * that never does: its message, left unsettled, is delivered again.
 */
function lastValueUntilAborted(
  source: Observable<unknown>,
  signal: AbortSignal | undefined,
  shutdown: AbortSignal,
): Promise<unknown> {
  if (signal?.aborted) return Promise.resolve(undefined);
  if (shutdown.aborted) return new Promise(() => undefined);
  let givenUp = false;
  const stop = merge(
    signal ? fromEvent(signal, 'abort') : NEVER,
    fromEvent(shutdown, 'abort').pipe(tap(() => (givenUp = true))),
  );
  return lastValueFrom(source.pipe(takeUntil(stop)), { defaultValue: undefined }).then((value) =>
    givenUp ? new Promise(() => undefined) : value,
  );
}

/** The controller, its signal listened on by any number of calls at once (past Node's 10). */
function unlimitedListeners(controller: AbortController): AbortController {
  setMaxListeners(0, controller.signal);
  return controller;
}

/**
 * Destroys the stream a call returned (a file to reply with, a `SequenceRecord`'s) once the call
 * is abandoned, whether it returned before or after: what an abandoned call returns is never
 * sent, and the stream's handle would stay open. An Observable is unsubscribed instead (see
 * {@link lastValueUntilAborted}).
 */
function destroyIfAbandoned(result: unknown, signal: AbortSignal): void {
  if (isObservable(result)) return;
  Promise.resolve(result).then(
    (value: unknown) => {
      const source: unknown = value instanceof SequenceRecord ? value.data : value;
      if (!(source instanceof Readable) && !isRecordSource(source)) return;
      if (signal.aborted) destroySource(source);
      else signal.addEventListener('abort', () => destroySource(source), { once: true });
    },
    () => undefined, // the call's own rejection is the pipeline's to report
  );
}

function splitDefinedBy(definedBy: string): [string, string] {
  const dot = definedBy.lastIndexOf('.');
  return dot < 0 ? [definedBy, 'handle'] : [definedBy.slice(0, dot), definedBy.slice(dot + 1)];
}
