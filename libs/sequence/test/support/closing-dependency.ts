import {
  Injectable,
  Module,
  type INestApplicationContext,
  type OnModuleDestroy,
} from '@nestjs/common';

/** A dependency of handlers that its module closes in `onModuleDestroy` (a database client). */
@Injectable()
export class ClosingDatabase implements OnModuleDestroy {
  closed = false;
  onModuleDestroy(): void {
    this.closed = true;
  }
}

@Module({ providers: [ClosingDatabase], exports: [ClosingDatabase] })
export class ClosingDatabaseModule {}

/**
 * For shutdown-order tests: a handler calls {@link use}, which records whether the database was
 * closed when it started and after it was held at a gate; {@link closeWhileHandling} closes the
 * application while the handler is held, then lets it go on.
 */
export function heldHandlerProbe() {
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  const seen: boolean[] = [];
  return {
    seen,
    async use(database: ClosingDatabase): Promise<void> {
      seen.push(database.closed);
      await released;
      seen.push(database.closed);
    },
    async closeWhileHandling(app: INestApplicationContext): Promise<void> {
      const closed = app.close();
      await new Promise((resolve) => setTimeout(resolve, 50));
      release();
      await closed;
    },
  };
}
