// Builds the library and packs it as an installable npm tarball, dist/nest-sequence-<version>.tgz
// (`npm run package`):
//
// 1. `nest build sequence` compiles libs/sequence/src into dist/libs/sequence (JavaScript,
//    declarations, source maps) and copies the Lua and SQL files, and the operator console's page
//    (HTML, CSS, an icon and browser modules), next to the code that reads them.
// 2. dist/package is staged with the compiled files (no tests, no TypeScript sources), the
//    package README, the repository's LICENSE and CHANGELOG.md, and a package.json derived from
//    libs/sequence/package.json.
// 3. `npm pack` writes the tarball into dist/.
//
// libs/sequence/package.json is the source of truth: name, version, peers, and the entry points
// and bin as the TypeScript files they are built from ("./src/redis.ts"); the published
// package.json names the compiled files instead.
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const library = path.join(root, 'libs/sequence');
const built = path.join(root, 'dist/libs/sequence');
const staging = path.join(root, 'dist/package');
const destination = path.join(root, 'dist');

/** What the build writes, shipped as it is except source maps (see shipSourceMap). */
const SHIPPED = ['.d.ts', '.js', '.js.map', '.lua', '.sql', '.html', '.css', '.svg'];
const TEST_FILE = /\.(e2e-)?spec\./;

function run(command, args) {
  const result = spawnSync(command, args, { cwd: root, stdio: ['ignore', 'inherit', 'inherit'] });
  if (result.status !== 0) {
    throw new Error(
      `${command} ${args.join(' ')} failed (${result.error ?? `exit ${result.status}`})`,
    );
  }
}

/**
 * Source maps: the build embeds each file's TypeScript in its map (`inlineSources` in
 * tsconfig.lib.json), and here each map names its source as the .ts file beside its .js
 * (`sequence/splitter.service.js.map` → `splitter.service.ts`), with no `sourceRoot`. Stack traces
 * (`node --enable-source-maps`) and debuggers then show the library's own lines under the
 * package's path, although no .ts file ships. As tsc writes them, the paths lead out of the
 * package (`../../../libs/sequence/src/...`) to files a user does not have.
 */
function shipSourceMap(from, to) {
  const map = JSON.parse(readFileSync(from, 'utf8'));
  if (map.sources.length !== 1 || map.sourcesContent?.length !== 1) {
    throw new Error(`${from}: expected one source with its content (is inlineSources set?)`);
  }
  delete map.sourceRoot;
  map.sources = [path.basename(to, '.js.map') + '.ts'];
  writeFileSync(to, JSON.stringify(map));
}

function stageBuild() {
  for (const file of readdirSync(built, { recursive: true, withFileTypes: true })) {
    if (!file.isFile()) continue;
    const from = path.join(file.parentPath, file.name);
    const relative = path.relative(built, from);
    if (TEST_FILE.test(file.name)) continue;
    if (!SHIPPED.some((extension) => file.name.endsWith(extension))) {
      throw new Error(
        `the build wrote ${relative}, which is not a ${SHIPPED.join(', ')} file: ship it or skip it here`,
      );
    }
    const to = path.join(staging, relative);
    mkdirSync(path.dirname(to), { recursive: true });
    if (file.name.endsWith('.js.map')) shipSourceMap(from, to);
    else copyFileSync(from, to);
  }
}

/** `./src/redis.ts` → `./redis` (without extension), checking the file is one the build compiles. */
function compiled(source) {
  const match = /^\.\/src\/(.+)\.ts$/.exec(source);
  if (!match) throw new Error(`libs/sequence/package.json: ${source} is not a ./src/*.ts file`);
  return `./${match[1]}`;
}

function publishedManifest(source) {
  const exports = {};
  const typesVersions = {};
  for (const [subpath, entry] of Object.entries(source.exports)) {
    const file = compiled(entry);
    exports[subpath] = { types: `${file}.d.ts`, require: `${file}.js`, default: `${file}.js` };
    // TypeScript's `moduleResolution: node` (node10) ignores `exports`: this maps its subpaths.
    if (subpath !== '.') typesVersions[subpath.slice(2)] = [`${file}.d.ts`];
  }
  exports['./package.json'] = './package.json';
  const bin = Object.fromEntries(
    Object.entries(source.bin).map(([name, file]) => [name, `${compiled(file)}.js`]),
  );
  return {
    name: source.name,
    version: source.version,
    description: source.description,
    license: source.license,
    keywords: source.keywords,
    engines: source.engines,
    main: exports['.'].require,
    types: exports['.'].types,
    exports,
    typesVersions: { '*': typesVersions },
    bin,
    files: [...SHIPPED.map((extension) => `**/*${extension}`), 'CHANGELOG.md'],
    // No module does anything when loaded but define things: bundlers may drop unused ones.
    sideEffects: false,
    peerDependencies: source.peerDependencies,
    peerDependenciesMeta: source.peerDependenciesMeta,
  };
}

const source = JSON.parse(readFileSync(path.join(library, 'package.json'), 'utf8'));
rmSync(built, { recursive: true, force: true });
rmSync(staging, { recursive: true, force: true });
run(path.join(root, 'node_modules/.bin/nest'), ['build', 'sequence']);

stageBuild();
copyFileSync(path.join(library, 'README.md'), path.join(staging, 'README.md'));
copyFileSync(path.join(root, 'LICENSE'), path.join(staging, 'LICENSE'));
copyFileSync(path.join(root, 'CHANGELOG.md'), path.join(staging, 'CHANGELOG.md'));
writeFileSync(
  path.join(staging, 'package.json'),
  `${JSON.stringify(publishedManifest(source), null, 2)}\n`,
);

const packed = spawnSync('npm', ['pack', staging, '--pack-destination', destination, '--json'], {
  cwd: root,
  encoding: 'utf8',
  stdio: ['ignore', 'pipe', 'inherit'],
});
if (packed.status !== 0)
  throw new Error(`npm pack failed (${packed.error ?? `exit ${packed.status}`})`);
const [tarball] = JSON.parse(packed.stdout);
console.log(
  `${path.relative(root, path.join(destination, tarball.filename))}: ${tarball.entryCount} files, ` +
    `${(tarball.size / 1024).toFixed(0)} KiB (${(tarball.unpackedSize / 1024).toFixed(0)} KiB unpacked)`,
);
