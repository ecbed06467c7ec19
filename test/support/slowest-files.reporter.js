/**
 * A Jest reporter that prints, after the run, the test files that took longest and the share of
 * the run they took: where to look first when the suite nears CI's time limit (.ci/run).
 * `SLOWEST_FILES` sets how many are listed (20; 0 turns it off).
 */
class SlowestFilesReporter {
  onRunComplete(_contexts, results) {
    const count = Number(process.env.SLOWEST_FILES ?? 20);
    if (!(count > 0)) return;
    const files = results.testResults
      .map((result) => ({
        path: result.testFilePath.slice(process.cwd().length + 1),
        seconds: (result.perfStats.end - result.perfStats.start) / 1000,
      }))
      .filter((file) => Number.isFinite(file.seconds))
      .sort((a, b) => b.seconds - a.seconds);
    const total = files.reduce((sum, file) => sum + file.seconds, 0);
    const shown = files.slice(0, count);
    const shownTotal = shown.reduce((sum, file) => sum + file.seconds, 0);
    const lines = shown.map((file) => `${file.seconds.toFixed(1).padStart(7)} s  ${file.path}`);
    process.stderr.write(
      `\nSlowest ${shown.length} of ${files.length} test files ` +
        `(${shownTotal.toFixed(0)} s of ${total.toFixed(0)} s):\n${lines.join('\n')}\n`,
    );
  }
}

module.exports = SlowestFilesReporter;
