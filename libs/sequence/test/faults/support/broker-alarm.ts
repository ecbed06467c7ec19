import { rabbitmqctl } from './rabbitmqctl';

/**
 * Raises a memory alarm on the local RabbitMQ (its memory high watermark set next to nothing):
 * the broker blocks every connection that publishes until the alarm clears. Resolves with what
 * clears it (the watermark as it was). The alarm is the whole broker's: tests run one at a time
 * (`--runInBand`), and a test that raises it clears it in its cleanup.
 */
export async function raiseMemoryAlarm(): Promise<() => Promise<void>> {
  const was = (
    await rabbitmqctl(['eval', 'vm_memory_monitor:get_vm_memory_high_watermark().'])
  ).trim();
  // A fraction (0.4) or {absolute,Bytes}: set back as rabbitmqctl takes it.
  const absolute = /^\{absolute,\s*(\d+)\}$/.exec(was);
  const restore = absolute ? ['absolute', absolute[1]] : [was];
  if (!absolute && !/^\d+(\.\d+)?$/.test(was)) {
    throw new Error(`unexpected memory high watermark from rabbitmqctl: ${was}`);
  }
  await rabbitmqctl(['set_vm_memory_high_watermark', '0.0000001']);
  return async () => {
    await rabbitmqctl(['set_vm_memory_high_watermark', ...restore]);
  };
}
