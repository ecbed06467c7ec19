import { InMemoryTransport } from '../adapters/transports/in-memory/in-memory.transport';
import type { ChannelRegistry } from '../kernel/channel.registry';
import { resolveAdminOptions } from './admin.options';
import { DeadLettersReader } from './dead-letters.reader';

describe('DeadLettersReader on a box that browses without taking', () => {
  const CHANNEL = 'orders';

  async function reader(): Promise<{
    reader: DeadLettersReader;
    transport: InMemoryTransport;
    browse: jest.SpyInstance;
  }> {
    const transport = new InMemoryTransport();
    const box = transport.deadLetters();
    expect(box.browseIsNonDestructive).toBe(true);
    const browse = jest.spyOn(box, 'browse');
    jest.spyOn(transport, 'deadLetters').mockReturnValue(box);
    const registry = { all: () => [{ channel: CHANNEL }], get: () => undefined };
    return {
      reader: new DeadLettersReader(
        transport,
        resolveAdminOptions({}),
        registry as unknown as ChannelRegistry,
      ),
      transport,
      browse,
    };
  }

  const deadLetter = (transport: InMemoryTransport, reason: string) =>
    transport.publish(transport.deadLetterChannel(CHANNEL), Buffer.from('x'), {
      'x-death-reason': reason,
    });

  it('reads the dead letters again only once their count changed, not at every summary', async () => {
    const { reader: dead, transport, browse } = await reader();
    await deadLetter(transport, 'crc-mismatch: fragment 1');
    await deadLetter(transport, 'expired: sequence s');

    // A console refreshing: the overview and the list, twice.
    for (let refresh = 0; refresh < 2; refresh++) {
      expect(await dead.summary()).toEqual([expect.objectContaining({ total: 2 })]);
      await dead.channelReasons(CHANNEL);
    }
    expect(browse).toHaveBeenCalledTimes(1);

    await deadLetter(transport, 'expired: sequence t');
    const [summary] = await dead.summary();
    expect(browse).toHaveBeenCalledTimes(2);
    expect(summary).toMatchObject({
      total: 3,
      byReason: [
        { reason: 'expired', count: 2 },
        { reason: 'crc-mismatch', count: 1 },
      ],
    });
    await transport.close();
  });
});
