// The engine list and the synthesis form built from the chosen engine's declared params.

function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "text") node.textContent = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  node.append(...children);
  return node;
}

export { element };

// Why an engine cannot synthesize here, or "" when it can.
export function unavailableReason(engine) {
  if (engine.status !== "ok") {
    return `status ${engine.status}` + (engine.error ? `: ${engine.error}` : "");
  }
  if (!(engine.capabilities || []).includes("synthesize")) {
    return "it does not synthesize (capabilities: " + (engine.capabilities || []).join(", ") + ")";
  }
  return "";
}

// One radio row per engine; those that cannot synthesize are disabled with their reason.
export function renderEngines(list, engines, onChoose) {
  list.replaceChildren();
  for (const engine of engines) {
    const reason = unavailableReason(engine);
    const radio = element("input", {
      type: "radio",
      name: "engine",
      value: engine.id,
      disabled: Boolean(reason),
    });
    radio.addEventListener("change", () => onChoose(engine));
    const label = element(
      "label",
      { class: reason ? "engine unavailable" : "engine", "data-engine": engine.id },
      radio,
      element("span", { class: "engine-id", text: engine.id }),
      element("span", { class: "engine-name", text: engine.name }),
      element("span", { class: `badge status-${engine.status}`, text: engine.status }),
      element("span", { class: "capabilities", text: (engine.capabilities || []).join(" · ") }),
    );
    if (reason) {
      label.append(element("span", { class: "reason", text: `Cannot synthesize: ${reason}` }));
    }
    list.append(element("li", {}, label));
  }
}

function describeRange(param) {
  const parts = [];
  if (param.minimum !== undefined) {
    parts.push(`${param.exclusive_minimum ? ">" : "≥"} ${param.minimum}`);
  }
  if (param.maximum !== undefined) {
    parts.push(`${param.exclusive_maximum ? "<" : "≤"} ${param.maximum}`);
  }
  return parts.join(", ");
}

function numberInput(param) {
  const integer = param.type === "int";
  let min = param.minimum;
  let max = param.maximum;
  if (integer && min !== undefined && param.exclusive_minimum) min += 1;
  if (integer && max !== undefined && param.exclusive_maximum) max -= 1;
  return element("input", {
    type: "number",
    min,
    max,
    step: integer ? 1 : "any",
    value: param.default ?? "",
    placeholder: param.default === null ? "none" : null,
  });
}

function choiceInput(param) {
  const select = element("select");
  if (param.default === null) select.append(element("option", { value: "", text: "(none)" }));
  for (const choice of param.choices) {
    select.append(element("option", { value: String(choice), text: String(choice) }));
  }
  select.value = param.default === null ? "" : String(param.default);
  return select;
}

function boolInput(param) {
  if (param.default === null) {
    return choiceInput({ ...param, choices: [true, false] });
  }
  return element("input", { type: "checkbox", checked: param.default === true });
}

function inputFor(param) {
  if (param.choices) return choiceInput(param);
  if (param.type === "int" || param.type === "float") return numberInput(param);
  if (param.type === "bool") return boolInput(param);
  return element("input", {
    type: "text",
    value: param.default ?? "",
    placeholder: param.default === null ? "none" : null,
  });
}

// The typed value of one param's input, or null when it is left empty.
function readValue(param, input) {
  if (input.type === "checkbox") return input.checked;
  const raw = input.value.trim();
  if (raw === "") return null;
  if (param.type === "int") return Number.parseInt(raw, 10);
  if (param.type === "float") return Number.parseFloat(raw);
  if (param.type === "bool") return raw === "true";
  return raw;
}

// Fills `container` with a row per declared param; returns a function that reads the params
// changed from their defaults as typed JSON values.
export function renderParams(container, engine) {
  container.replaceChildren();
  const inputs = [];
  for (const param of engine.params || []) {
    const input = inputFor(param);
    input.name = `param-${param.name}`;
    input.id = `param-${param.name}`;
    input.dataset.param = param.name;
    const range = describeRange(param);
    const hint = [param.help, range].filter(Boolean).join(" — ");
    const label = element("label", { for: input.id, title: hint, text: param.name });
    const row = element(
      "div",
      { class: "param-row" },
      label,
      input,
      element("small", { class: "hint", text: hint }),
    );
    container.append(row);
    inputs.push([param, input]);
  }
  if (!inputs.length) {
    container.append(element("p", { class: "muted", text: "This engine declares no params." }));
  }
  return () => {
    const params = {};
    for (const [param, input] of inputs) {
      const value = readValue(param, input);
      if (value === null || Number.isNaN(value) || value === param.default) continue;
      params[param.name] = value;
    }
    return params;
  };
}

// The model and device choices of an engine ("" = the host's choice).
export function renderChoices(select, values, defaultLabel) {
  select.replaceChildren(element("option", { value: "", text: defaultLabel }));
  for (const value of values || []) select.append(element("option", { value, text: value }));
}
