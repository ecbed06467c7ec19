import { rabbitmqctl } from '../../support/processes/rabbitmqctl';

const ALARM_WATERMARK = 0.0000001;
/** RabbitMQ's own default `vm_memory_high_watermark`. */
const DEFAULT_WATERMARK = 0.4;

/**
 * Raises a memory alarm on the local RabbitMQ (its memory high watermark set next to nothing):
 * the broker blocks every connection that publishes until the alarm clears. Resolves with what
 * clears it (the watermark as it was). The alarm is the whole broker's: `npm test` runs the files
 * that raise it (`*broker-alarm*`) alone, after the others, and a test that raises it clears it
 * in its cleanup.
 */
export async function raiseMemoryAlarm(): Promise<() => Promise<void>> {
  const was = (
    await rabbitmqctl(['eval', 'vm_memory_monitor:get_vm_memory_high_watermark().'])
  ).trim();
  // A fraction (0.4) or {absolute,Bytes}: set back as rabbitmqctl takes it. The alarm's own
  // value (a run killed before its cleanup) is not the broker's: back to RabbitMQ's default.
  const absolute = /^\{absolute,\s*(\d+)\}$/.exec(was);
  const fraction = Number(was);
  if (!absolute && !(fraction > 0)) {
    throw new Error(`unexpected memory high watermark from rabbitmqctl: ${was}`);
  }
  const restore = absolute
    ? ['absolute', absolute[1]]
    : [fraction < ALARM_WATERMARK * 10 ? String(DEFAULT_WATERMARK) : was];
  await rabbitmqctl(['set_vm_memory_high_watermark', String(ALARM_WATERMARK)]);
  return async () => {
    await rabbitmqctl(['set_vm_memory_high_watermark', ...restore]);
  };
}
