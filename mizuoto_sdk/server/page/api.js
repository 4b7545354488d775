// Calls to the server's JSON API. The token, when the server has one, rides in its HttpOnly
// cookie (set by GET /?token=...), so nothing here handles it.

const BASE = "/api/v1";

// An error the API answered with: {code, message, detail}, and the HTTP status.
export class ApiError extends Error {
  constructor(code, message, detail = {}, status = 0) {
    super(message);
    this.code = code;
    this.detail = detail;
    this.status = status;
  }
}

// The ApiError a failed response carries (a body that is not the API's error shape still
// becomes one, coded by its status).
export async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: fall through
  }
  if (body && typeof body.code === "string") {
    return new ApiError(body.code, body.message ?? "", body.detail ?? {}, response.status);
  }
  const message = response.statusText || "request failed";
  return new ApiError(`http_${response.status}`, message, {}, response.status);
}

export async function getJson(path) {
  const response = await fetch(BASE + path, { headers: { Accept: "application/json" } });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

export async function postJson(path, body, signal = undefined) {
  const response = await fetch(BASE + path, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// POST /convert or /edit: the WAV file and the JSON request as multipart/form-data. The
// X-Mizuoto-Client header is what tells the server a form elsewhere did not send it.
export async function upload(capability, request, file, signal) {
  const body = new FormData();
  body.append("audio", file, file.name || "audio.wav");
  body.append("request", JSON.stringify(request));
  const response = await fetch(`${BASE}/${capability}`, {
    method: "POST",
    headers: { Accept: "audio/wav", "X-Mizuoto-Client": "page" },
    body,
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  return response;
}

// POST /synthesize: the Response itself, whose body streams the WAV.
export async function synthesize(request, signal) {
  const response = await fetch(BASE + "/synthesize", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "audio/wav" },
    body: JSON.stringify(request),
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  return response;
}
