// The bus lives in kernel/ (the patterns emit on it, and they may not depend on observability/);
// this path stays for the integrations that import it from here.
export * from '../kernel/lifecycle-events';
