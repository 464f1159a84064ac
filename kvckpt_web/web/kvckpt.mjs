// kvckpt_web in the browser: boot Pyodide offline and install the kvckpt_web wheel.
//
// The Python package is the single source of truth; this module only loads it and
// forwards a few calls:
//
//   import { boot } from "/kvckpt.mjs";
//   const kv = await boot();                       // Pyodide + micropip + kvckpt_web from this origin
//   const r = await kv.runJSON("import json; json.dumps({'ok': 1})");
//   (checkpoint()/restore() wrappers over kvckpt_web.persist are not written yet: use runJSON)
//
// Served by `kvckpt serve` (routes /pyodide/, /wheels/ and /wheels/index.json).

const here = new URL(".", import.meta.url);

export async function boot({ base = here.href, packages = [], log = () => {} } = {}) {
  const t0 = performance.now();
  const { loadPyodide } = await import(new URL("pyodide/pyodide.mjs", base).href);
  const pyodide = await loadPyodide({ indexURL: new URL("pyodide/", base).href });
  const index = await (await fetch(new URL("wheels/index.json", base))).json();
  const url = (name) => {
    const norm = (s) => s.toLowerCase().replace(/[-.]+/g, "_");
    const wheel = index.wheels.find((w) => norm(w.split("-")[0]) === norm(name));
    if (!wheel) throw new Error(`wheel ${name}: expected in /wheels/, got none`);
    return new URL("wheels/" + wheel, base).href;
  };
  const errors = [];
  await pyodide.loadPackage([url("packaging"), url("micropip")], {
    messageCallback: log, errorCallback: (m) => errors.push(m),
  });
  if (errors.length) throw new Error("loadPackage failed: " + errors.join("; "));
  const micropip = pyodide.pyimport("micropip");
  const wanted = ["kvckpt_web", ...packages].map(url);
  await micropip.install(wanted, { deps: false });
  micropip.destroy();
  log(`kvckpt_web ready in ${(performance.now() - t0).toFixed(0)} ms`);
  return new KVCkpt(pyodide);
}

export class KVCkpt {
  constructor(pyodide) {
    this.pyodide = pyodide;
  }

  // Run Python source (top-level await allowed); its last expression must be a JSON string.
  async runJSON(source) {
    const out = await this.pyodide.runPythonAsync(source);
    return typeof out === "string" ? JSON.parse(out) : out;
  }
}
