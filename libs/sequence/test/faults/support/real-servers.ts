import { describeWithServer } from '../../support/servers';

/**
 * `describe` for the fault tests, which need both RabbitMQ and Redis: skipped with a warning
 * when either is down, and failing (naming the server) under CI.
 */
export function describeOnRealServers(name: string, body: () => void): void {
  describeWithServer('rabbitmq', name, () => {
    describeWithServer('redis', 'on RabbitMQ and Redis', body);
  });
}
