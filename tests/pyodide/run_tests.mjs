// Run pure-Python parts of the test suite inside Pyodide under Node.
//   node --experimental-wasm-stack-switching run_tests.mjs PYODIDE_DIR TESTS_DIR WHEEL... -- PYTEST_ARGS...
// Wheels are loaded from local files (kvckpt_web built from this tree, pytest, hypothesis and their deps);
// TESTS_DIR is mounted at /work/tests. Exit status: pytest's.
import path from "node:path";
import { pathToFileURL } from "node:url";

const argv = process.argv.slice(2);
const sep = argv.indexOf("--");
const [pyodideDir, testsDir, ...wheels] = sep < 0 ? argv : argv.slice(0, sep);
const pytestArgs = sep < 0 ? [] : argv.slice(sep + 1);

const { loadPyodide } = await import(pathToFileURL(path.join(pyodideDir, "pyodide.mjs")).href);
const py = await loadPyodide({ indexURL: path.resolve(pyodideDir) + "/" });
const errors = [];
await py.loadPackage(wheels.map((w) => path.resolve(w)), { messageCallback: () => {}, errorCallback: (m) => errors.push(m) });
if (errors.length) {
  console.error("loadPackage failed: " + errors.join("; "));
  process.exit(2);
}
py.FS.mkdirTree("/work/tests");
py.FS.mount(py.FS.filesystems.NODEFS, { root: path.resolve(testsDir) }, "/work/tests");
py.FS.chdir("/work");
py.setStdout({ write: (buf) => { process.stdout.write(buf); return buf.length; } });
py.setStderr({ write: (buf) => { process.stderr.write(buf); return buf.length; } });
py.globals.set("pytest_args", py.toPy(pytestArgs));
const rc = await py.runPythonAsync(`
import sys, pytest
print("Python", sys.version.split()[0], "on", sys.platform)
int(pytest.main(["-p", "no:cacheprovider", *pytest_args]))
`);
process.exit(rc);
