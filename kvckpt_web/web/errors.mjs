// How an error crosses a boundary of the browser runtime (Python to JavaScript, the engine's worker to the page): as
// its wire fields {name, message, field?, expected?, got?, reason?} (kvckpt_web/web/runtime.py's error_fields is the
// Python side), and back as a plain Error whose `name` is the kvckpt_web class ("FieldError", "StoreError", ...).

// The fields beside name and message: `field`, `expected`, `got` of an error about one value, `reason` of an
// UnusableCheckpointError.
const DETAILS = ["field", "expected", "got", "reason"];

// The wire fields of `e` (an Error, or anything thrown).
export function errorFields(e) {
  const fields = { name: e?.name ?? "Error", message: String(e?.message ?? e) };
  for (const key of DETAILS) if (e && typeof e === "object" && key in e) fields[key] = e[key];
  return fields;
}

// The Error of wire fields `fields`; `options` as Error's ({cause}).
export function errorOf(fields, options) {
  const error = new Error(fields.message, options);
  error.name = fields.name ?? "Error";
  for (const key of DETAILS) if (key in fields) error[key] = fields[key];
  return error;
}

// A FieldError: `field`, the value expected there and the one got.
export function fieldError(field, expected, got) {
  return errorOf({ name: "FieldError", message: `${field}: expected ${expected}, got ${got}`, field, expected, got });
}
