// The chat page's models: those its server serves (`kvckpt serve --model A.gguf --model B.gguf`, listed by
// /models.json), the one picked (remembered in this browser; ?model=FILE overrides), whether each one's weights are
// kept in this browser already, and which model wrote each conversation (noted when its reply is saved under its name).
import { keptWeights } from "/kvckpt.mjs";
import { kib } from "./figures.mjs";
import { $ } from "./view.mjs";

const PICKED = "kvckpt-chat:model";

// What the page (page.mjs's Page) does with its models; `requested`: the file the page's address names, or null.
export function modelsOf(page, requested) {
  const { state } = page;
  const writerKey = (name) => `kvckpt-chat:model-of:${$("store").value}:${name}`;
  const byFile = (file) => state.models.find((m) => m.file === file) ?? null;

  // The served models, each with `kept` (its weights in this browser); the picked one, if it is still served.
  async function list() {
    let models = [];
    try {
      const answer = await fetch("/models.json", { cache: "no-store" });
      if (answer.ok) models = (await answer.json()).models;
    } catch (error) {
      state.errors.push(error);
    }
    for (const m of models) m.kept = m.available && await keptWeights(m.url);
    state.models = models;
    const wanted = requested ?? state.picked ?? localStorage.getItem(PICKED);
    state.picked = (byFile(wanted) ?? models[0])?.file ?? null;
    requested = null;
    draw();
  }

  const label = (m) => (m.available ? `${m.name ?? m.file} · ${m.quant ?? "unknown quant"} · ${kib(m.bytes)} · ` +
    (m.kept ? "in this browser" : "to download") : `${m.file} · missing on the server`);

  function draw() {
    $("model-pick").hidden = state.models.length === 0;
    $("model").replaceChildren(...state.models.map((m) => {
      const option = new Option(label(m), m.file, false, m.file === state.picked);
      option.disabled = !m.available;
      return option;
    }));
  }

  // The URL the engine loads the picked model from (the server's only one, /model.gguf, if it lists none).
  const url = () => byFile(state.picked)?.url ?? "/model.gguf";

  function pick(file) {
    state.picked = file;
    localStorage.setItem(PICKED, file);
    draw();
  }

  // Conversation `name`'s reply is saved by the running model: note which one wrote it (its file, its identity).
  function wrote(name) {
    if (state.picked && state.model) {
      localStorage.setItem(writerKey(name), JSON.stringify({ file: state.picked, identity: state.model.identity }));
    }
  }

  // The served model that wrote conversation `name`, null if unknown; {file, available: false} if its file is not
  // served now, or holds another model now (the running one, whose identity is not the writer's).
  function writerOf(name) {
    const noted = JSON.parse(localStorage.getItem(writerKey(name)) ?? "null");
    if (noted === null) return null;
    const served = byFile(noted.file);
    const replaced = noted.file === state.picked && noted.identity !== state.model?.identity;
    return served && !replaced ? served : { file: noted.file, available: false };
  }

  return { list, label, url, pick, wrote, writerOf };
}
