import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  CHECK_IN_KEYS,
  CLAIM_CHECK_HANDLER_KEYS,
  CLAIM_PUBLISH_KEYS,
  INBOX_HANDLER_KEYS,
  MODULE_KEYS,
  RESEQUENCER_DEFINITION_KEYS,
  SEND_KEYS,
  SEQUENCED_HANDLER_KEYS,
  SEQUENCE_CLIENT_KEYS,
  SEQUENCE_SERVER_KEYS,
  type KeyTree,
} from '../../src/options/option-keys';

/**
 * Each guide ends with an `## Options reference` whose tables list every option of the options
 * objects it documents, and nothing else. The options come from the key trees of
 * `option-keys.ts`, which `option-keys.spec.ts` holds equal to the options' types. The format is
 * described in the docs' own words: one `### <object>` heading per options object, one table under
 * it, one option path in backticks in each row's first cell.
 */

const ROOT = join(__dirname, '../../../..');

/** Pattern guides stay under this many words, counted like `wc -w`. */
const GUIDE_WORD_LIMIT = 4000;

/**
 * Option objects that also take a scalar (`metrics: false`): their own path is a row too. The
 * key trees cannot say so; `SequenceModuleOptions` in module-options.ts does.
 */
const ALSO_SCALAR: ReadonlySet<string> = new Set(['metrics', 'tracing']);

/** What `SequenceModule.forRoot` takes besides `SequenceModuleOptions` (sequence.module-definition.ts). */
const FOR_ROOT_EXTRAS: KeyTree = { isGlobal: true };

/** `OutboxService.publishEvent` / `sendCommand`'s second argument (outbox.service.ts `JoinOptions`). */
const JOIN_KEYS: KeyTree = { client: true, headers: true };

/** The module options each pattern guide documents; the rest are in configuration.md. */
const PATTERN_MODULE_KEYS = ['sequence', 'claimCheck', 'resequencer', 'outbox', 'tuning'];

/** Every path a table of `tree` must hold: its leaves, and its objects that also take a scalar. */
function optionPaths(tree: KeyTree, at = ''): string[] {
  return Object.entries(tree).flatMap(([key, value]) => {
    const path = at ? `${at}.${key}` : key;
    if (value === true) return [path];
    return [...(ALSO_SCALAR.has(path) ? [path] : []), ...optionPaths(value, path)];
  });
}

function subtree(key: string): KeyTree {
  const tree = MODULE_KEYS[key];
  if (tree === undefined || tree === true) throw new Error(`MODULE_KEYS.${key} is not a subtree`);
  return { [key]: tree };
}

const moduleWide: KeyTree = {
  ...Object.fromEntries(
    Object.entries(MODULE_KEYS).filter(([key]) => !PATTERN_MODULE_KEYS.includes(key)),
  ),
  ...FOR_ROOT_EXTRAS,
};

interface ExpectedTable {
  /** The `### ` heading's text (backticks ignored). */
  heading: string;
  paths: string[];
  /** A table of `SequenceModule.forRoot`'s options. */
  module?: true;
}

interface ExpectedDoc {
  file: string;
  /** A pattern guide: under GUIDE_WORD_LIMIT words. */
  guide: boolean;
  tables: ExpectedTable[];
}

const DOCS: ExpectedDoc[] = [
  {
    file: 'docs/configuration.md',
    guide: false,
    tables: [
      { heading: 'SequenceModule.forRoot', paths: optionPaths(moduleWide), module: true },
      { heading: 'tuning', paths: optionPaths(subtree('tuning')), module: true },
    ],
  },
  {
    file: 'docs/message-sequence.md',
    guide: true,
    tables: [
      { heading: 'sequence', paths: optionPaths(subtree('sequence')), module: true },
      { heading: '@SequencedHandler', paths: optionPaths(SEQUENCED_HANDLER_KEYS) },
      { heading: 'SplitterService.send', paths: optionPaths(SEND_KEYS) },
    ],
  },
  {
    file: 'docs/resequencer.md',
    guide: true,
    tables: [
      { heading: 'resequencer', paths: optionPaths(subtree('resequencer')), module: true },
      { heading: '@Resequenced', paths: optionPaths(RESEQUENCER_DEFINITION_KEYS) },
    ],
  },
  {
    file: 'docs/claim-check.md',
    guide: true,
    tables: [
      { heading: 'claimCheck', paths: optionPaths(subtree('claimCheck')), module: true },
      { heading: '@ClaimCheck', paths: optionPaths(CLAIM_CHECK_HANDLER_KEYS) },
      { heading: 'ClaimCheckService.checkIn', paths: optionPaths(CHECK_IN_KEYS) },
      { heading: 'ClaimCheckService.publish', paths: optionPaths(CLAIM_PUBLISH_KEYS) },
    ],
  },
  {
    file: 'docs/outbox-inbox.md',
    guide: true,
    tables: [
      { heading: 'outbox', paths: optionPaths(subtree('outbox')), module: true },
      { heading: '@InboxHandler', paths: optionPaths(INBOX_HANDLER_KEYS) },
      { heading: 'OutboxService.publishEvent and sendCommand', paths: optionPaths(JOIN_KEYS) },
    ],
  },
  {
    file: 'docs/microservices.md',
    guide: true,
    tables: [
      { heading: 'SequenceServer', paths: optionPaths(SEQUENCE_SERVER_KEYS) },
      { heading: 'SequenceClient', paths: optionPaths(SEQUENCE_CLIENT_KEYS) },
    ],
  },
];

const SECTION = 'Options reference';

interface FoundTable {
  heading: string;
  /** Each body row's first cell, as written. */
  cells: string[];
  tables: number;
}

interface Reference {
  problems: string[];
  tables: FoundTable[];
}

/** The `## Options reference` section of a doc, read as the format says. */
function readReference(text: string): Reference {
  const problems: string[] = [];
  const tables: FoundTable[] = [];
  let fenced = false;
  let inSection = false;
  let sections = 0;
  let current: FoundTable | undefined;
  let tableLine = 0;
  for (const line of text.split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) fenced = !fenced;
    if (fenced) continue;
    const heading = /^(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line);
    if (heading) {
      const level = heading[1].length;
      const title = heading[2].replace(/`/g, '').trim();
      if (level === 2 && title === SECTION) {
        sections += 1;
        inSection = true;
      } else if (inSection && level <= 2) {
        problems.push(`"${heading[0].trim()}" comes after "## ${SECTION}": it must end the doc`);
        inSection = false;
      } else if (inSection && level === 3) {
        current = { heading: title, cells: [], tables: 0 };
        tables.push(current);
      }
      tableLine = 0;
      continue;
    }
    if (!inSection) continue;
    if (!line.trimStart().startsWith('|')) {
      tableLine = 0;
      continue;
    }
    tableLine += 1;
    if (!current) {
      problems.push(`a table row before any "### " heading of "## ${SECTION}": ${line.trim()}`);
      continue;
    }
    if (tableLine === 1) current.tables += 1;
    if (tableLine <= 2) continue; // the header row and the separator
    const first = line
      .trim()
      .replace(/^\|/, '')
      .split(/(?<!\\)\|/)[0]
      .trim();
    current.cells.push(first);
  }
  if (sections === 0) problems.push(`no "## ${SECTION}" section`);
  if (sections > 1) problems.push(`${sections} "## ${SECTION}" sections; one ends the doc`);
  return { problems, tables };
}

/** What is wrong with a doc's reference tables, each problem naming the file and the table. */
function tableProblems(doc: ExpectedDoc, text: string): string[] {
  const reference = readReference(text);
  const problems = reference.problems.map((problem) => `${doc.file}: ${problem}`);
  const { tables } = reference;
  const where = (heading: string) => `${doc.file} "### ${heading}"`;
  const expected = new Map(doc.tables.map((table) => [table.heading, table.paths]));
  for (const { heading } of doc.tables) {
    if (!tables.some((table) => table.heading === heading)) {
      problems.push(`${where(heading)}: missing heading (the table of ${heading}'s options)`);
    }
  }
  const seen = new Set<string>();
  for (const table of tables) {
    const paths = expected.get(table.heading);
    if (!paths) {
      problems.push(
        `${where(table.heading)}: not a heading of this doc's reference; its headings are ` +
          doc.tables.map(({ heading }) => `"${heading}"`).join(', '),
      );
      continue;
    }
    if (seen.has(table.heading)) problems.push(`${where(table.heading)}: heading given twice`);
    seen.add(table.heading);
    if (table.tables !== 1) {
      problems.push(`${where(table.heading)}: ${table.tables} tables under it; one is wanted`);
    }
    const listed = new Set<string>();
    for (const cell of table.cells) {
      const path = /^`([^`\s]+)`$/.exec(cell)?.[1];
      if (path === undefined) {
        problems.push(`${where(table.heading)}: row whose first cell is not one \`path\`: ${cell}`);
      } else if (listed.has(path)) {
        problems.push(`${where(table.heading)}: \`${path}\` listed twice`);
      } else {
        listed.add(path);
        if (!paths.includes(path)) {
          problems.push(`${where(table.heading)}: \`${path}\` is not an option of this table`);
        }
      }
    }
    for (const path of paths) {
      if (!listed.has(path)) problems.push(`${where(table.heading)}: missing row \`${path}\``);
    }
  }
  return problems;
}

const wordCount = (text: string): number => text.split(/\s+/).filter(Boolean).length;

describe('options reference tables of the docs', () => {
  it('give every module option to exactly one table', () => {
    const owned = DOCS.flatMap((doc) =>
      doc.tables.filter((table) => table.module).flatMap(({ paths }) => paths),
    );
    const all = optionPaths({ ...MODULE_KEYS, ...FOR_ROOT_EXTRAS });
    expect([...owned].sort()).toEqual([...all].sort());
  });

  describe.each(DOCS)('$file', (doc) => {
    const path = join(ROOT, doc.file);
    const read = (): string => {
      if (!existsSync(path)) throw new Error(`${doc.file} does not exist`);
      return readFileSync(path, 'utf8');
    };

    it(`ends with "## ${SECTION}" listing every option it documents, and only those`, () => {
      expect(tableProblems(doc, read())).toEqual([]);
    });

    if (doc.guide) {
      it(`stays under ${GUIDE_WORD_LIMIT} words`, () => {
        const words = wordCount(read());
        expect({ file: doc.file, words, under: words < GUIDE_WORD_LIMIT }).toEqual({
          file: doc.file,
          words,
          under: true,
        });
      });
    }
  });
});
