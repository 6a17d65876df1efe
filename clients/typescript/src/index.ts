/**
 * The toolauthz runtime SDK for TypeScript: run an agent's tool calls only as the
 * toolauthz sidecar allows (docs/typescript.md).
 */
export { AuthzClient, type AuthzClientOptions, type CallOptions, type OutcomeName, type OutcomeReport, RpcError,
  callMessage, contextMessage, entitiesJson, DEFAULT_TIMEOUT_MS } from "./client.js";
export { type EntitiesProvider, Principal, ProposedCall, TrustedContext, rawJson } from "./context.js";
export { type CallFields, DIGEST_DOMAIN, callDigest, canonicalJson, digestOfRaw } from "./digest.js";
export { Guard, type GuardClient, type GuardEvent, type GuardOptions, GuardStateError, type RunOptions,
  type TurnCall, DEFAULT_EXECUTION_TIMEOUT_MS } from "./guard.js";
export { InvalidInputError, type JsonValue, parseStrictJson } from "./json.js";
export { OfflineVerifier, type Verification, type VerificationCode } from "./offline.js";
export { CallResult, MESSAGES, type Reported, type Status, type ToolResultBlock } from "./results.js";
export { NO_RETRY, RetryPolicy, type RetryPolicyInit } from "./retry.js";
export { AdaptiveThrottle, CONGESTED_METADATA, ThrottledError, ThrottlePolicy, type ThrottlePolicyInit,
  type ThrottleSources } from "./throttle.js";
export { type ToolFunction, ToolError, type ToolInvocation, type ToolOptions, ToolSet } from "./tools.js";
export type { ClientTls } from "./transport.js";
export * as authorizer from "./gen/toolauthz/v1/authorizer_pb.js";
export * as approvals from "./gen/toolauthz/v1/approvals_pb.js";
export { type Answer, type AssembledCall, CallAssembly, type RefusedCall, REFUSALS } from "./assembly.js";
export { AnthropicToolStream, ChatCompletionsToolStream, ResponsesToolStream } from "./streaming.js";
