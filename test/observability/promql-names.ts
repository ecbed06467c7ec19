/**
 * The metric and label names a PromQL expression uses, found by a small tokenizer rather than by
 * regular expressions over the text: string literals (whose contents may look like names) are
 * skipped, function and aggregation names are told apart from metric names by the `(` that
 * follows them, and durations, numbers and keywords are not names.
 */
export interface PromqlNames {
  /** Each vector selector: its metric name and the label names its matchers use. */
  readonly selectors: { readonly metric: string; readonly labels: readonly string[] }[];
  /** Labels of `by`, `without`, `on`, `ignoring`, `group_left` and `group_right` lists. */
  readonly grouping: readonly string[];
}

/** Words that are neither metrics nor functions: operators and modifiers. */
const KEYWORDS = new Set(['and', 'or', 'unless', 'bool', 'offset', 'inf', 'nan', 'atan2']);
/** Keywords followed by a parenthesised list of label names. */
const LABEL_LISTS = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right']);

const NAME_START = /[A-Za-z_:]/;
const NAME_PART = /[A-Za-z0-9_:]/;
const SPACE = /\s/;

export function promqlNames(expr: string): PromqlNames {
  const selectors: { metric: string; labels: string[] }[] = [];
  const grouping: string[] = [];
  let i = 0;

  const skipSpace = () => {
    for (;;) {
      while (i < expr.length && SPACE.test(expr[i])) i++;
      if (expr[i] !== '#') return;
      while (i < expr.length && expr[i] !== '\n') i++;
    }
  };
  const readName = (): string => {
    const start = i;
    while (i < expr.length && NAME_PART.test(expr[i])) i++;
    return expr.slice(start, i);
  };
  const skipString = () => {
    const quote = expr[i++];
    while (i < expr.length && expr[i] !== quote) i += expr[i] === '\\' && quote !== '`' ? 2 : 1;
    if (i >= expr.length) throw new Error(`unterminated string in: ${expr}`);
    i++;
  };
  const expect = (char: string) => {
    skipSpace();
    if (expr[i] !== char) {
      throw new Error(`expected '${char}' at ${i} of: ${expr} (found '${expr[i] ?? 'end'}')`);
    }
    i++;
  };
  /** `{name op "value", ...}` after `{`: the label names, and the `__name__` value if any. */
  const readMatchers = (): { labels: string[]; name?: string } => {
    const labels: string[] = [];
    let name: string | undefined;
    for (;;) {
      skipSpace();
      if (expr[i] === '}') {
        i++;
        return { labels, name };
      }
      if (expr[i] === '"' || expr[i] === "'" || expr[i] === '`') {
        // A quoted metric name or label (UTF-8 names): not used by the shipped files.
        throw new Error(`quoted names are not supported: ${expr}`);
      }
      const label = readName();
      if (!label) throw new Error(`expected a label name at ${i} of: ${expr}`);
      skipSpace();
      const op = expr.slice(i, i + 2);
      i += op === '!=' || op === '=~' || op === '!~' ? 2 : expr[i] === '=' ? 1 : 0;
      skipSpace();
      if (expr[i] !== '"' && expr[i] !== "'" && expr[i] !== '`') {
        throw new Error(`expected a quoted value at ${i} of: ${expr}`);
      }
      const valueStart = i + 1;
      skipString();
      if (label === '__name__') name = expr.slice(valueStart, i - 1);
      else labels.push(label);
      skipSpace();
      if (expr[i] === ',') i++;
    }
  };
  const readLabelList = () => {
    expect('(');
    for (;;) {
      skipSpace();
      if (expr[i] === ')') {
        i++;
        return;
      }
      const label = readName();
      if (!label) throw new Error(`expected a label name at ${i} of: ${expr}`);
      grouping.push(label);
      skipSpace();
      if (expr[i] === ',') i++;
    }
  };

  /** Whether `by (` or `without (` comes next (after an aggregation's name); `i` is left alone. */
  const followedByGrouping = (): boolean => {
    const at = i;
    const word = readName();
    skipSpace();
    const grouping = (word === 'by' || word === 'without') && expr[i] === '(';
    i = at;
    return grouping;
  };

  while (i < expr.length) {
    skipSpace();
    if (i >= expr.length) break;
    const char = expr[i];
    if (char === '"' || char === "'" || char === '`') {
      skipString();
    } else if (char === '[') {
      // A range or subquery duration: [5m], [1h:1m].
      while (i < expr.length && expr[i] !== ']') i++;
      i++;
    } else if (/[0-9.]/.test(char)) {
      // A number or a duration (15m, 1e3, 0.99).
      while (i < expr.length && /[0-9A-Za-z.+_]/.test(expr[i])) {
        if ((expr[i] === '+' || expr[i] === '-') && !/[eE]/.test(expr[i - 1])) break;
        i++;
      }
    } else if (char === '{') {
      i++;
      const { labels, name } = readMatchers();
      if (!name) throw new Error(`a selector without a metric name in: ${expr}`);
      selectors.push({ metric: name, labels });
    } else if (NAME_START.test(char)) {
      const word = readName();
      skipSpace();
      if (LABEL_LISTS.has(word) && expr[i] === '(') {
        readLabelList();
      } else if (KEYWORDS.has(word.toLowerCase())) {
        // an operator or modifier
      } else if (expr[i] === '(' || followedByGrouping()) {
        // a function or an aggregation (`sum by (a) (...)`): its arguments follow
      } else if (expr[i] === '{') {
        i++;
        selectors.push({ metric: word, labels: readMatchers().labels });
      } else {
        selectors.push({ metric: word, labels: [] });
      }
    } else {
      i++;
    }
  }
  return { selectors, grouping };
}

/** Grafana's template variables, replaced as Grafana would for a query of `prefix`. */
export function expandGrafanaVariables(expr: string, prefix: string): string {
  return expr
    .replace(/\$\{prefix\}|\$prefix\b/g, prefix)
    .replace(/\$__(rate_interval|interval|range)\b/g, '5m')
    .replace(/\$\{job\}|\$job\b/g, '.*');
}
