/**
 * Checking a token locally, against the keys GetKeys publishes: PASETO v4.public by the
 * maintained `paseto` package, with the call's digest as the implicit assertion.
 *
 *     const checker = new OfflineVerifier(client);
 *     const verification = await checker.check(token, context, call);   // .ok, .code, .claims
 *
 * It proves the token was issued by the sidecar for this exact call (signature, digest,
 * times, audience, issuer, subject, tenant, tool, call id) without a round trip. It
 * CANNOT prove the token was not used already: single use is the sidecar's ledger, so a
 * runtime that executes must still call Verify (the Guard always does).
 */
import { InspectFooter, PublicProtocol } from "paseto";
import { ImportPublicKeyFactory, type PublicKey, VerifyFactory } from "paseto/v4/public";

import type { AuthzClient } from "./client.js";
import type { ProposedCall, TrustedContext } from "./context.js";
import { callDigest } from "./digest.js";
import { InvalidInputError, parseStrictJson } from "./json.js";

const v4 = new PublicProtocol(ImportPublicKeyFactory, VerifyFactory);
const MAX_TOKEN_CHARS = 8 * 1024;
const MAX_FOOTER_BYTES = 512;
const KID = /^k4\.pid\.[A-Za-z0-9_-]{44}$/;
const RFC3339 = /^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$/;

export type VerificationCode = "ok" | "malformed" | "unknown_key" | "bad_signature" | "expired" | "not_yet_valid"
  | "wrong_audience" | "claims_mismatch";

export interface Verification {
  code: VerificationCode;
  ok: boolean;
  claims?: Record<string, unknown>;
  detail: string; // why, for logs; never the token or the claims
}

export interface OfflineVerifierOptions {
  audience?: string;
  issuer?: string;
  refreshMs?: number;
  leewaySeconds?: number;
  now?: () => number; // milliseconds, for tests
}

type KeysSource = Pick<AuthzClient, "getKeys">;

export class OfflineVerifier {
  private keys = new Map<string, PublicKey>();
  private fetched = -Infinity;
  private readonly audience: string;
  private readonly issuer: string;
  private readonly refreshMs: number;
  private readonly leeway: number;
  private readonly now: () => number;

  constructor(private readonly client: KeysSource, options: OfflineVerifierOptions = {}) {
    this.audience = options.audience ?? "toolauthz-runtime";
    this.issuer = options.issuer ?? "toolauthz";
    this.refreshMs = options.refreshMs ?? 300_000;
    this.leeway = options.leewaySeconds ?? 5;
    this.now = options.now ?? Date.now;
    if (!Number.isInteger(this.leeway) || this.leeway < 0 || this.leeway > 5) {
      throw new RangeError("leewaySeconds must be an integer from 0 to 5");
    }
  }

  /**
   * The sidecar's verification keys by the id GetKeys lists them under. (`paseto` has no
   * PASERK id function for v4; a wrong id could only pick a key whose signature then
   * fails, never accept a token.)
   */
  async refresh(force = false): Promise<void> {
    if (!force && performance.now() - this.fetched <= this.refreshMs) return;
    const response = await this.client.getKeys();
    const keys = new Map<string, PublicKey>();
    for (const entry of response.keys) {
      if (!entry.paserk.startsWith("k4.public.")) throw new TypeError("every public key needs a `k4.public` PASERK");
      const paserk = entry.paserk as `k4.public.${string}`;
      if (!KID.test(entry.kid)) throw new TypeError("every public key needs a `k4.pid` id");
      keys.set(entry.kid, await v4.ImportPublicKey(paserk));
    }
    this.keys = keys;
    this.fetched = performance.now();
  }

  async check(token: string, context: TrustedContext, call: ProposedCall): Promise<Verification> {
    let digest: string;
    try {
      digest = callDigest({ tool: call.name, tenant: context.tenant, callId: call.callId,
        principalType: context.principal.type, principalId: context.principal.id }, parseStrictJson(call.inputJson));
    } catch (error) {
      if (!(error instanceof InvalidInputError)) throw error;
      return fail("bad_signature", "the call's input does not parse");
    }
    const kid = footerKid(token);
    if (typeof kid !== "string") return kid;
    await this.refresh();
    if (!this.keys.has(kid)) await this.refresh(true); // a key rotated in since the last refresh
    const key = this.keys.get(kid);
    if (key === undefined) return fail("unknown_key", "no published key has this id");
    let claims: Record<string, unknown>;
    try {
      ({ claims } = await v4.Verify(key, token, { implicitAssertion: new TextEncoder().encode(digest),
        now: new Date(this.now()), clockTolerance: this.leeway }));
    } catch (error) {
      const failure = error as { code?: string; claim?: string };
      if (failure.code !== "ERR_PASETO_CLAIM_VALIDATION") {
        return fail("bad_signature", "the signature does not verify for this digest");
      }
      if (failure.claim === "exp") return fail("expired", "token has expired");
      if (failure.claim === "nbf" || failure.claim === "iat") return fail("not_yet_valid", "token is not valid yet");
      return fail("malformed", "the claims are not valid");
    }
    return this.checkClaims(claims, digest, context, call);
  }

  private checkClaims(claims: Record<string, unknown>, digest: string, context: TrustedContext,
                      call: ProposedCall): Verification {
    const at = this.now() / 1000;
    const times: Record<string, number> = {};
    for (const name of ["exp", "nbf", "iat"]) {
      const value = claims[name];
      if (typeof value !== "string" || !RFC3339.test(value)) {
        return fail("malformed", `claim \`${name}\` is missing or not an RFC 3339 time`);
      }
      times[name] = Date.parse(value) / 1000;
    }
    if (typeof claims.jti !== "string" || claims.jti === "") return fail("malformed", "claim `jti` is missing");
    if (times.exp! < at - this.leeway) return fail("expired", "token has expired");
    if (times.nbf! > at + this.leeway) return fail("not_yet_valid", "token is not valid yet (nbf)");
    if (times.iat! > at + this.leeway) return fail("not_yet_valid", "token was issued in the future (iat)");
    if (claims.aud !== this.audience) return fail("wrong_audience", "token is for another audience");
    if (claims.iss !== this.issuer) return fail("claims_mismatch", "token is from another issuer");
    const escaped = context.principal.id.replaceAll("\\", "\\\\").replaceAll('"', '\\"');
    const want: Record<string, string> = { sub: `${context.principal.type}::"${escaped}"`, tenant: context.tenant,
      tool: call.name, call_id: call.callId, dig: digest };
    for (const [name, value] of Object.entries(want)) {
      if (claims[name] !== value) return fail("claims_mismatch", `claim \`${name}\` does not match the call`);
    }
    return { code: "ok", ok: true, claims, detail: "" };
  }
}

/** The token's key id, from a footer that is exactly {"kid": "k4.pid.…"}, or why not. */
function footerKid(token: unknown): string | Verification {
  if (typeof token !== "string") return fail("malformed", "token is not a string");
  if (token.length > MAX_TOKEN_CHARS) return fail("malformed", `token is longer than ${MAX_TOKEN_CHARS} characters`);
  if (!token.startsWith("v4.public.")) return fail("malformed", "token is not `v4.public`");
  let footer: Uint8Array;
  try {
    footer = InspectFooter(token);
  } catch {
    return fail("malformed", "token cannot be read");
  }
  if (footer.length === 0) return fail("malformed", "token has no footer");
  if (footer.length > MAX_FOOTER_BYTES) return fail("malformed", `footer is longer than ${MAX_FOOTER_BYTES} bytes`);
  let doc: unknown;
  try {
    doc = parseStrictJson(footer, { maxBytes: MAX_FOOTER_BYTES });
  } catch {
    return fail("malformed", "footer is not JSON");
  }
  const kid = (doc as { kid?: unknown } | null)?.kid;
  if (typeof doc !== "object" || doc === null || Array.isArray(doc) || Object.keys(doc).length !== 1
      || typeof kid !== "string" || !KID.test(kid)) {
    return fail("malformed", 'footer must be exactly {"kid": "k4.pid.…"}');
  }
  return kid;
}

function fail(code: VerificationCode, detail: string): Verification {
  return { code, ok: false, detail };
}
