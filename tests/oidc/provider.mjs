// A real OpenID Connect provider for gpulab's login tests (tests/test_auth_oidc.py):
// npm's certified `oidc-provider` (scripts/setup.sh test installs it under .venv/node),
// with a plain login form and consent granted at once for its one client.
//
//   node provider.mjs PORT ACCOUNTS_JSON
//
// Issuer http://127.0.0.1:PORT. The client comes from the environment:
// OIDC_CLIENT_ID, OIDC_CLIENT_SECRET, OIDC_REDIRECT_URI (the hub's /hub/oauth_callback).
// ACCOUNTS_JSON is read again each time a password is checked or claims are asked, so a
// test changes someone's groups between two logins by rewriting it:
//   {"alice": {"password": "...", "groups": ["gpu-team"]}, ...}
// Each account's key is its `sub` (and its sign-in name); its `preferred_username` is
// the key too, or its "username" where it has one (two accounts may call themselves
// alike, as at providers where people choose their own names).
import { generateKeyPairSync, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

// oidc-provider lives in .venv/node (not next to this file): resolve it from there.
const venvNode = process.env.GPULAB_NODE_MODULES
  ?? join(dirname(new URL(import.meta.url).pathname), "../../.venv/node/node_modules");
const require = createRequire(join(venvNode, "noop.js"));
const { default: Provider } = await import(require.resolve("oidc-provider"));

const [port, accountsFile] = process.argv.slice(2);
if (!/^[0-9]{1,5}$/.test(port ?? "") || !accountsFile) {
  console.error("usage: node provider.mjs PORT ACCOUNTS_JSON");
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;
const MAX_BODY = 64 * 1024;

function accounts() {
  return JSON.parse(readFileSync(accountsFile, "utf8"));
}

const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: process.env.OIDC_CLIENT_ID,
      client_secret: process.env.OIDC_CLIENT_SECRET,
      redirect_uris: [process.env.OIDC_REDIRECT_URI],
      grant_types: ["authorization_code"],
      response_types: ["code"],
      // oauthenticator sends the client's id and secret in the token request's body
      token_endpoint_auth_method: "client_secret_post",
    },
  ],
  claims: {
    openid: ["sub"],
    profile: ["preferred_username", "name"],
    email: ["email", "email_verified"],
    groups: ["groups"],
  },
  scopes: ["openid", "profile", "email", "groups"],
  jwks: { keys: [{ ...privateKey.export({ format: "jwk" }), kid: "test", use: "sig" }] },
  cookies: { keys: [randomBytes(32).toString("hex")] },
  features: { devInteractions: { enabled: false } },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, sub) {
    if (!Object.hasOwn(accounts(), sub)) return undefined;
    return {
      accountId: sub,
      async claims() {
        const who = accounts()[sub] ?? {};
        return {
          sub,
          preferred_username: who.username ?? sub,
          name: sub,
          email: `${sub}@lab.test`,
          email_verified: true,
          groups: who.groups ?? [],
        };
      },
    };
  },
});

function escape(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function loginPage(res, uid, message, status = 200) {
  res.statusCode = status;
  res.setHeader("Content-Type", "text/html; charset=utf-8");
  res.end(`<!doctype html><title>Lab sign-in</title><h1>Lab sign-in</h1>
<p class="error">${escape(message)}</p>
<form method="post" action="/interaction/${escape(uid)}/login">
<input name="username" autocomplete="username">
<input name="password" type="password" autocomplete="current-password">
<button type="submit">Sign in</button>
</form>`);
}

async function body(req) {
  let size = 0;
  const parts = [];
  for await (const chunk of req) {
    size += chunk.length;
    if (size > MAX_BODY) throw new Error("request body too large");
    parts.push(chunk);
  }
  return new URLSearchParams(Buffer.concat(parts).toString("utf8"));
}

async function grantConsent(req, res, details) {
  const { prompt, params, session } = details;
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(" "));
  if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
  for (const [indicator, scopes] of Object.entries(prompt.details.missingResourceScopes ?? {})) {
    grant.addResourceScope(indicator, scopes.join(" "));
  }
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
}

const providerCallback = provider.callback();
const INTERACTION = /^\/interaction\/([A-Za-z0-9_-]{1,128})(\/login)?$/;

createServer(async (req, res) => {
  const path = new URL(req.url, issuer).pathname;
  const m = INTERACTION.exec(path);
  if (!m) return providerCallback(req, res);
  try {
    const details = await provider.interactionDetails(req, res);
    const [, uid, login] = m;
    if (details.uid !== uid) throw new Error("interaction mismatch");
    if (!login && req.method === "GET") {
      if (details.prompt.name === "login") return loginPage(res, uid, "");
      if (details.prompt.name === "consent") return await grantConsent(req, res, details);
      throw new Error(`unexpected prompt ${details.prompt.name}`);
    }
    if (login && req.method === "POST" && details.prompt.name === "login") {
      const form = await body(req);
      const name = form.get("username") ?? "";
      const who = Object.hasOwn(accounts(), name) ? accounts()[name] : undefined;
      if (!who || who.password !== (form.get("password") ?? "")) {
        console.log(`login refused for ${JSON.stringify(name)}`);
        return loginPage(res, uid, "Wrong username or password.", 401);
      }
      console.log(`login of ${name}`);
      return await provider.interactionFinished(
        req, res, { login: { accountId: name } }, { mergeWithLastSubmission: false },
      );
    }
    res.statusCode = 405;
    res.end("method not allowed");
  } catch (err) {
    console.error(`interaction failed: ${err?.stack ?? err}`);
    res.statusCode = 400;
    res.setHeader("Content-Type", "text/plain; charset=utf-8");
    res.end(`sign-in failed: ${err?.message ?? err}`);
  }
}).listen(Number(port), "127.0.0.1", () => console.log(`oidc-provider listening on ${issuer}`));
