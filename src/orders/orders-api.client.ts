import { randomInt } from 'node:crypto';
import { EVERYDAY_SKUS } from './orders.catalogue';
import type { OrderLine, OrderView, StockView } from './orders.model';

/** An HTTP answer as the demo prints and checks it. */
export interface HttpAnswer<Body = unknown> {
  readonly method: 'GET' | 'POST';
  readonly path: string;
  readonly status: number;
  readonly body: Body;
}

/** The orders demo's HTTP API, as a client of it (the run uses it like any other would). */
export class OrdersApiClient {
  constructor(private readonly base: string) {}

  placeOrder(items: readonly OrderLine[]): Promise<HttpAnswer<OrderView>> {
    return this.call('POST', '/orders', { items });
  }

  order(id: string): Promise<HttpAnswer<OrderView>> {
    return this.call('GET', `/orders/${encodeURIComponent(id)}`);
  }

  stock(sku: string): Promise<HttpAnswer<StockView>> {
    return this.call('GET', `/stock/${encodeURIComponent(sku)}`);
  }

  /** The stock of each sku; throws when one is not answered 200. */
  async stockOf(skus: readonly string[]): Promise<Map<string, StockView>> {
    const answers = await Promise.all(skus.map((sku) => this.stock(sku)));
    for (const answer of answers) expectStatus(answer, 200);
    return new Map(answers.map(({ body }) => [body.sku, body]));
  }

  private async call<Body>(
    method: 'GET' | 'POST',
    path: string,
    body?: unknown,
  ): Promise<HttpAnswer<Body>> {
    const response = await fetch(this.base + path, {
      method,
      headers: body === undefined ? undefined : { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { method, path, status: response.status, body: (await response.json()) as Body };
  }
}

/** Throws, with the answer, when it is not `status`. */
export function expectStatus(answer: HttpAnswer, status: number): void {
  if (answer.status !== status) {
    throw new Error(
      `${answer.method} ${answer.path} answered ${answer.status}, expected ${status}: ` +
        JSON.stringify(answer.body),
    );
  }
}

/** `count` orders of one to three everyday products, one to three of each. */
export function plannedOrders(count: number): OrderLine[][] {
  return Array.from({ length: count }, () => {
    const first = randomInt(EVERYDAY_SKUS.length);
    return Array.from({ length: randomInt(1, 4) }, (_, line) => ({
      sku: EVERYDAY_SKUS[(first + line) % EVERYDAY_SKUS.length],
      qty: randomInt(1, 4),
    }));
  });
}
