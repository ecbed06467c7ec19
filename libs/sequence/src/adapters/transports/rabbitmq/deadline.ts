/**
 * Settles as `promise` does, unless `deadline` (epoch milliseconds) passes first: then rejects
 * with `onTimeout()`. `promise` is still observed afterwards, so its late rejection is handled.
 */
export function beforeDeadline<T>(
  promise: Promise<T>,
  deadline: number,
  onTimeout: () => Error,
): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(onTimeout()), Math.max(0, deadline - Date.now()));
    promise.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: Error) => {
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
