// Evaluates IAM requests against policy documents as AWS does, with @cloud-copilot/iam-simulate (package.json).
// stdin: a JSON list of {"identityPolicies": [policy, ...], "resourcePolicy": policy|null, "request": {"principal",
// "action", "resource", "accountId", "context": {key: value}}}; stdout: a JSON list, one {"result", "errors"} each,
// in order. "result" is the simulator's overall result (Allowed, ImplicitlyDenied, ExplicitlyDenied, ...) or
// "error" when the request itself is not valid for the action (an unknown action, a resource of the wrong type).
import { runSimulation } from '@cloud-copilot/iam-simulate';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const simulations = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const results = [];
for (const simulation of simulations) {
  const { request } = simulation;
  const outcome = await runSimulation({
    request: {
      principal: request.principal,
      action: request.action,
      resource: { resource: request.resource, accountId: request.accountId },
      contextVariables: request.context || {},
    },
    identityPolicies: simulation.identityPolicies.map((policy, index) => ({ name: `policy${index}`, policy })),
    resourcePolicy: simulation.resourcePolicy || undefined,
    serviceControlPolicies: [],
    resourceControlPolicies: [],
  }, {});
  results.push(outcome.resultType === 'error'
    ? { result: 'error', errors: outcome.errors }
    : { result: outcome.overallResult, errors: null });
}
process.stdout.write(JSON.stringify(results));
