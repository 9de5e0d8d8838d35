// A real OAuth 2.1 / OpenID authorization server for the tests: panva's oidc-provider (installed into .node/ by
// `make install`), configured the way hosted MCP servers' authorization servers behave. Started by
// tests/oauth_servers.py; never used outside tests.
//
//   node tests/oauth_provider.mjs            (configuration through environment variables, see below)
//
// What it does:
// - dynamic client registration (RFC 7591) at /reg, open (no initial access token);
// - authorization code with PKCE, S256 required for every client;
// - resource indicators (RFC 8707): any http://127.0.0.1 resource gets JWT access tokens whose `aud` is that
//   resource and whose scope is `mcp:tools`;
// - refresh tokens for every client allowed the refresh_token grant, rotated on every use (a rotated token used
//   again is refused and, as oidc-provider does, revokes the whole grant);
// - short access-token lifetimes (FBX_TEST_AS_ACCESS_TTL seconds, default 60);
// - revocation and introspection endpoints;
// - a one-page login + consent interaction at /interaction/<uid>: GET shows a form, POST `login=<account>` with
//   `decision=approve` (or `deny`) finishes it. Tests post to it over HTTP; a browser can fill it in.
//
// Test-only endpoints (outside the provider): GET /__test/requests lists what reached the authorization and token
// endpoints (parameter names and values as the provider parsed them), DELETE /__test/requests clears the list.
//
// Environment: FBX_TEST_OIDC_PROVIDER_MODULE (path of oidc-provider's lib/index.js, required),
// FBX_TEST_AS_ACCESS_TTL (seconds), FBX_TEST_AS_ISSUE_REFRESH ("0" = never issue refresh tokens).
// On start it listens on a free 127.0.0.1 port and prints one JSON line {"issuer": "http://127.0.0.1:<port>"}.

import http from 'node:http';
import { pathToFileURL, URLSearchParams } from 'node:url';

// The package lives in the project's .node/ tree, not next to this file, so the starter names its entry module.
const { default: Provider } = await import(pathToFileURL(process.env.FBX_TEST_OIDC_PROVIDER_MODULE).href);

const ACCESS_TTL = Number(process.env.FBX_TEST_AS_ACCESS_TTL || '60');
const ISSUE_REFRESH = process.env.FBX_TEST_AS_ISSUE_REFRESH !== '0';
const RESOURCE_SCOPE = 'mcp:tools';
const RECORDED = ['grant_type', 'client_id', 'redirect_uri', 'scope', 'state', 'code_challenge',
  'code_challenge_method', 'code_verifier', 'resource', 'prompt', 'response_type'];

const recorded = [];

function isLoopbackResource(resource) {
  try {
    const url = new URL(resource);
    return url.protocol === 'http:' && url.hostname === '127.0.0.1' && !url.hash;
  } catch {
    return false;
  }
}

function configuration() {
  return {
    clients: [],
    scopes: ['openid', 'offline_access', RESOURCE_SCOPE],
    claims: { openid: ['sub'] },
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: false },
      registration: { enabled: true },
      revocation: { enabled: true },
      introspection: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => undefined,
        useGrantedResource: () => true,
        getResourceServerInfo(ctx, resourceIndicator) {
          if (!isLoopbackResource(resourceIndicator)) {
            throw new Provider.errors.InvalidTarget('this test server only serves http://127.0.0.1 resources');
          }
          return {
            scope: RESOURCE_SCOPE,
            audience: resourceIndicator,
            accessTokenFormat: 'jwt',
            accessTokenTTL: ACCESS_TTL,
          };
        },
      },
    },
    issueRefreshToken: async (ctx, client) => ISSUE_REFRESH && client.grantTypeAllowed('refresh_token'),
    rotateRefreshToken: () => true,
    ttl: {
      AccessToken: ACCESS_TTL,
      AuthorizationCode: 60,
      Grant: 3600,
      IdToken: 3600,
      Interaction: 600,
      RefreshToken: 86400,
      Session: 3600,
    },
    interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
    async findAccount(ctx, sub) {
      return { accountId: sub, async claims() { return { sub }; } };
    },
    cookies: { keys: ['fluidbox-test-only-cookie-key'] },
  };
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    let data = '';
    req.setEncoding('utf8');
    req.on('data', (chunk) => { data += chunk; });
    req.on('end', () => resolve(new URLSearchParams(data)));
    req.on('error', reject);
  });
}

function send(res, status, type, body) {
  res.writeHead(status, { 'content-type': type, 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

async function interaction(provider, req, res, uid) {
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) {
    send(res, 400, 'text/plain', 'interaction mismatch');
    return;
  }
  if (req.method === 'GET') {
    const client = details.params.client_id;
    send(res, 200, 'text/html; charset=utf-8', `<!doctype html>
<html><body>
<h1>Sign in to the test authorization server</h1>
<p>Client <code>${escapeHtml(client)}</code> asks for <code>${escapeHtml(details.params.scope || '')}</code>
(prompt <code>${escapeHtml(details.prompt.name)}</code>: ${escapeHtml(details.prompt.reasons.join(', '))}).</p>
<form method="post" action="/interaction/${escapeHtml(uid)}">
  <label>Account <input name="login" value="alice"></label>
  <button type="submit" name="decision" value="approve">Approve</button>
  <button type="submit" name="decision" value="deny">Deny</button>
</form>
</body></html>`);
    return;
  }
  const form = await readBody(req);
  if (form.get('decision') !== 'approve') {
    await provider.interactionFinished(req, res, {
      error: 'access_denied',
      error_description: 'the user refused the request',
    }, { mergeWithLastSubmission: false });
    return;
  }
  const accountId = form.get('login') || 'alice';
  const grant = new provider.Grant({ accountId, clientId: details.params.client_id });
  const requested = String(details.params.scope || '').split(' ').filter(Boolean);
  // Every scope this provider lists is an OP scope to it (mcp:tools included, so discovery advertises it); the
  // resource's own scope is granted per resource below.
  if (requested.length) grant.addOIDCScope(requested.join(' '));
  const resource = details.params.resource;
  for (const r of (Array.isArray(resource) ? resource : resource ? [resource] : [])) {
    grant.addResourceScope(r, RESOURCE_SCOPE);
  }
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, {
    login: { accountId },
    consent: { grantId },
  }, { mergeWithLastSubmission: false });
}

const server = http.createServer();
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  const issuer = `http://127.0.0.1:${port}`;
  const provider = new Provider(issuer, configuration());

  // Record what the authorization and token endpoints received, as the provider parsed it.
  provider.use(async (ctx, next) => {
    await next();
    const route = ctx.oidc && ctx.oidc.route;
    if (route === 'authorization' || route === 'token') {
      const params = {};
      for (const name of RECORDED) {
        const value = ctx.oidc.params && ctx.oidc.params[name];
        if (value !== undefined) params[name] = value;
      }
      recorded.push({ route, status: ctx.status, params });
    }
  });

  const handle = provider.callback();
  server.on('request', (req, res) => {
    const url = new URL(req.url, issuer);
    if (url.pathname === '/__test/requests') {
      if (req.method === 'DELETE') recorded.length = 0;
      send(res, 200, 'application/json', JSON.stringify(recorded));
      return;
    }
    const match = url.pathname.match(/^\/interaction\/([^/]+)$/);
    if (match) {
      interaction(provider, req, res, match[1]).catch((err) => {
        send(res, 400, 'text/plain', `interaction failed: ${err.message}`);
      });
      return;
    }
    handle(req, res);
  });
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});

process.on('SIGTERM', () => server.close(() => process.exit(0)));
