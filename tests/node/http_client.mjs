// A runtime that is not Python and does not speak gRPC: Node's built-in fetch against the
// HTTP/JSON API. Usage: node http_client.mjs BASE_URL CALL_ID RAW_INPUT_JSON
// Prints one JSON line: {"authorize": <response>, "verify": <response>}.
// The model's arguments are spliced into the body as the text the model wrote, so the
// digest covers exactly that text (never JSON.parse then JSON.stringify).

const [baseUrl, callId, rawInput] = process.argv.slice(2);

const context = {
  tenant: "acme",
  principal: { type: "User", id: "alice" },
  request_id: "run-node",
  entities: [{
    uid: { type: "Order", id: "ord_1" },
    attrs: { owner: { __entity: { type: "User", id: "alice" } }, refundable_cents: 10000 },
    parents: [],
  }],
};

function body(extra) {
  const head = JSON.stringify({ ...extra, context }).slice(0, -1);
  const call = JSON.stringify({ call_id: callId, name: "issue_refund" }).slice(0, -1);
  return `${head},"call":${call},"input":${rawInput}}}`;
}

async function post(path, text) {
  const response = await fetch(`${baseUrl}${path}`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: text,
  });
  const answer = await response.json();
  if (!response.ok) {
    throw new Error(`${path}: HTTP ${response.status} ${JSON.stringify(answer)}`);
  }
  return answer;
}

const authorize = await post("/v1/authorize", body({}));
const verify = await post("/v1/verify", body({ token: authorize.token }));
console.log(JSON.stringify({ authorize, verify }));
