// The web page of `twostep serve` (docs/serving.md#the-web-page): text in, translation out as one types, through
// the server's LibreTranslate API (GET /frontend/settings, GET /languages, POST /translate, POST /translate_file).
// Plain JS, nothing fetched from elsewhere: the server may be offline. The URL keeps ?source=&target=&q=.
"use strict";

const DEBOUNCE_MS = 400; // a request once the typing pauses this long
const ALTERNATIVES = 3; // asked for, as LibreTranslate's page asks; fewer where the server allows fewer
const $ = (id) => document.getElementById(id);

const page = {
  settings: null,
  languages: [], // GET /languages: [{code, name, targets}]
  names: new Map(), // code -> name
  alternatives: 0, // what /translate is asked for
  timer: null,
  sent: 0, // the latest request's number: an answer to an earlier one is dropped
  detected: null, // the language of the shown translation's text, where the source is auto
};

async function getJSON(path) {
  const response = await fetch(path);
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.error || `${path}: HTTP ${response.status}`);
  return answer;
}

function option(code, name) {
  const element = document.createElement("option");
  element.value = code;
  element.textContent = name;
  return element;
}

function named(code) {
  return page.names.get(code) || code;
}

// Where the server lists no languages (one model that takes any code), the page names none either.
function anyCode() {
  return page.languages.length === 0;
}

function source() {
  return anyCode() ? "auto" : $("source").value;
}

function target() {
  return anyCode() ? page.settings.language.target.code || "und" : $("target").value;
}

// The targets of the chosen source: all of them for auto (the detected language decides at each request).
function fillTargets(preferred) {
  const from = $("source").value;
  const language = page.languages.find((l) => l.code === from);
  const codes = language ? language.targets : [...new Set(page.languages.flatMap((l) => l.targets))];
  const keep = preferred || $("target").value;
  $("target").replaceChildren(...codes.map((code) => option(code, named(code))));
  const fallback = codes.find((code) => code !== from) || codes[0];
  $("target").value = codes.includes(keep) ? keep : fallback;
}

// The reverse pair must be offered: the target lists the source (or the detected language) among its targets.
function swappable() {
  const from = source() === "auto" ? page.detected : source();
  const into = page.languages.find((l) => l.code === target());
  return Boolean(from && into && into.targets.includes(from) && from !== target());
}

function keepURL() {
  const params = new URLSearchParams(location.search);
  if (!anyCode()) {
    params.set("source", source());
    params.set("target", target());
  }
  if ($("q").value) params.set("q", $("q").value);
  else params.delete("q");
  history.replaceState(null, "", `${location.pathname}?${params}`);
}

function count() {
  const limit = page.settings.charLimit;
  $("count").textContent = `${$("q").value.length} / ${limit}`;
  $("count").classList.toggle("full", $("q").value.length >= limit);
}

function showError(message) {
  $("error").textContent = message || "";
  $("error").hidden = !message;
}

function showDetected(detected) {
  page.detected = detected && detected.confidence > 0 ? detected.language : null;
  $("detected").hidden = !page.detected;
  $("detected").textContent = page.detected
    ? `Detected: ${named(page.detected)} (${Math.round(detected.confidence)}%)` : "";
  $("swap").disabled = !swappable();
}

function showAlternatives(alternatives) {
  $("alternatives").replaceChildren(...alternatives.map((text) => {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = text;
    button.title = "Use this translation";
    button.addEventListener("click", () => { // it and the shown translation change places
      const shown = $("translation").textContent;
      $("translation").textContent = text;
      button.textContent = shown;
    });
    item.append(button);
    return item;
  }));
}

function scheduled() {
  count();
  keepURL();
  clearTimeout(page.timer);
  page.timer = setTimeout(translate, DEBOUNCE_MS);
}

async function translate() {
  clearTimeout(page.timer);
  const q = $("q").value;
  const number = ++page.sent;
  if (!q.trim()) {
    $("translation").textContent = "";
    showAlternatives([]);
    showDetected(null);
    showError("");
    return;
  }
  const body = { q, source: source(), target: target(), format: "text" };
  if (page.alternatives) body.alternatives = page.alternatives;
  if ($("api-key").value) body.api_key = $("api-key").value;
  let response, answer;
  try {
    response = await fetch("translate", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    answer = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  } catch (exc) {
    answer = { error: `The server cannot be reached: ${exc.message}` };
  }
  if (number !== page.sent) return; // typed on since: a later answer is coming
  if (!response || !response.ok) {
    showError(answer.error || `HTTP ${response.status}`);
    return;
  }
  showError("");
  $("translation").textContent = answer.translatedText;
  showAlternatives(answer.alternatives || []);
  showDetected(answer.detectedLanguage || null);
}

function swap() {
  if (!swappable()) return;
  const from = source() === "auto" ? page.detected : source();
  const into = target();
  const translation = $("translation").textContent;
  $("source").value = into;
  fillTargets(from);
  if (translation) $("q").value = translation;
  $("translation").textContent = "";
  showAlternatives([]);
  showDetected(null);
  count();
  keepURL();
  translate();
}

async function copy() {
  const text = $("translation").textContent;
  try {
    await navigator.clipboard.writeText(text); // a secure context only (https, or localhost)
  } catch {
    const range = document.createRange(); // else the old way: select it, copy the selection
    range.selectNodeContents($("translation"));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    document.execCommand("copy");
  }
  $("copy").textContent = "Copied";
  setTimeout(() => { $("copy").textContent = "Copy"; }, 1200);
}

async function translateFile(event) {
  event.preventDefault();
  const file = $("file-input").files[0];
  if (!file) return;
  const form = new FormData();
  form.append("file", file);
  form.append("source", source());
  form.append("target", target());
  if ($("api-key").value) form.append("api_key", $("api-key").value);
  $("download").hidden = true;
  try {
    const response = await fetch("translate_file", { method: "POST", body: form });
    const answer = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
    if (!response.ok) throw new Error(answer.error || `HTTP ${response.status}`);
    showError("");
    $("download").href = answer.translatedFileUrl;
    $("download").hidden = false;
  } catch (exc) {
    showError(exc.message);
  }
}

// The most alternatives /translate takes here: its API document's maximum (--alternatives-limit, the beam limit).
async function alternativesLimit() {
  try {
    const document = await getJSON("openapi.json");
    const schema = document.paths["/translate"].post.requestBody.content["application/json"].schema;
    return schema.properties.alternatives.maximum;
  } catch {
    return 0;
  }
}

async function load() {
  for (;;) { // 503 while the server loads its models
    try {
      return await Promise.all([getJSON("frontend/settings"), getJSON("languages"), alternativesLimit()]);
    } catch (exc) {
      $("status").textContent = `Waiting for the server: ${exc.message}`;
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }
}

async function start() {
  const [settings, languages, most] = await load();
  page.settings = settings;
  page.languages = languages;
  page.alternatives = Math.min(ALTERNATIVES, most || 0);
  for (const language of languages) page.names.set(language.code, language.name);
  const params = new URLSearchParams(location.search);
  if (!anyCode()) {
    const sources = languages.map((l) => option(l.code, l.name));
    if (languages.length > 1) sources.unshift(option("auto", "Auto detect")); // detected among all of them
    $("source").replaceChildren(...sources);
    const codes = [...$("source").options].map((o) => o.value);
    const wanted = [params.get("source"), settings.language.source.code].find((code) => codes.includes(code));
    $("source").value = wanted || codes[0];
    fillTargets(params.get("target") || settings.language.target.code);
    $("languages").hidden = false;
  }
  $("status").hidden = true;
  $("q").maxLength = settings.charLimit;
  $("q").value = (params.get("q") || "").slice(0, settings.charLimit);
  $("key").hidden = !settings.keyRequired;
  $("file").hidden = !settings.filesTranslation;
  if (settings.supportedFilesFormat && settings.supportedFilesFormat.length) {
    $("file-input").accept = settings.supportedFilesFormat.join(",");
  }
  $("swap").disabled = !swappable();
  $("q").addEventListener("input", scheduled);
  $("source").addEventListener("change", () => { fillTargets(); showDetected(null); keepURL(); translate(); });
  $("target").addEventListener("change", () => { $("swap").disabled = !swappable(); keepURL(); translate(); });
  $("swap").addEventListener("click", swap);
  $("clear").addEventListener("click", () => { $("q").value = ""; scheduled(); $("q").focus(); });
  $("copy").addEventListener("click", copy);
  $("file").addEventListener("submit", translateFile);
  $("key").addEventListener("submit", (event) => { event.preventDefault(); translate(); });
  $("api-key").addEventListener("change", translate);
  count();
  keepURL();
  if ($("q").value) translate();
  $("q").focus();
}

start();
