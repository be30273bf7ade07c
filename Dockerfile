# Petstore API image. Three stages:
#   build   - the dependencies and the few compile-time packages tsc needs, then the service's compile -> dist/
#   deps    - production dependencies only (`npm ci --omit=dev`, without the workspaces):
#             no embedded-postgres, no TypeScript, no test tooling
#   runtime - deps' node_modules + dist + migrations, running as the non-root `node` user
# Both installs keep npm's cache in a BuildKit cache mount that later builds reuse (one at a time,
# so the second finds what the first fetched; the lock's integrity makes --prefer-offline safe).
# It needs BuildKit: the default builder since Docker 23, DOCKER_BUILDKIT=1 on 20.10, or podman.
ARG NODE_IMAGE=node:24-bookworm-slim

FROM ${NODE_IMAGE} AS build
WORKDIR /app
COPY package.json package-lock.json ./
# Only what compiling src/ needs: the dependencies (they carry their own types) and the
# devDependencies named below, at the lock's versions (npm ci accepts a package.json that names
# fewer packages than its lock). Install scripts only fetch or link binaries: not needed here.
RUN --mount=type=cache,target=/root/.npm,sharing=locked \
    node -e 'const fs = require("fs"), p = require("./package.json"), keep = process.argv.slice(1); \
      p.devDependencies = Object.fromEntries(Object.entries(p.devDependencies).filter(([name]) => keep.includes(name))); \
      delete p.workspaces; fs.writeFileSync("package.json", JSON.stringify(p))' \
      typescript @types/node @types/pg @types/pg-copy-streams @opentelemetry/sdk-trace \
 && npm ci --ignore-scripts --prefer-offline --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY packages/embedded-postgres ./packages/embedded-postgres
COPY src ./src
# The service and the types of what it imports without DATABASE_URL (@petstore/embedded-postgres, linked as npm
# would; the image never ships it); npm run build also compiles clients/typescript, which the image does not ship.
RUN mkdir -p node_modules/@petstore && ln -s ../../packages/embedded-postgres node_modules/@petstore/embedded-postgres \
 && npx tsc -b packages/embedded-postgres tsconfig.build.json

FROM ${NODE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
# The workspaces' dependencies count as production ones: dropped with them.
RUN --mount=type=cache,target=/root/.npm,sharing=locked \
    node -e 'const fs = require("fs"), p = require("./package.json"); delete p.workspaces; \
      fs.writeFileSync("package.json", JSON.stringify(p))' \
 && npm ci --omit=dev --ignore-scripts --prefer-offline --no-audit --no-fund

FROM ${NODE_IMAGE} AS runtime
ENV NODE_ENV=production \
    HOST=0.0.0.0 \
    PORT=3000 \
    METRICS_HOST=0.0.0.0 \
    METRICS_PORT=9464
WORKDIR /app
# Everything stays owned by root: the process (user node) only needs to read it.
COPY package.json package-lock.json ./
COPY --from=deps /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY migrations ./migrations
USER node
EXPOSE 3000 9464
# The slim image has no curl/wget; Node 24's global fetch does the probe.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:'+(process.env.PORT||3000)+'/health/ready',{signal:AbortSignal.timeout(2500)}).then(r=>process.exit(r.status===200?0:1),()=>process.exit(1))"]
STOPSIGNAL SIGTERM
# node runs as PID 1 on purpose: the app installs its own SIGTERM/SIGINT handlers
# (close-with-grace), so the signal is not ignored, and it spawns no children to reap.
# `docker run --init` / compose `init: true` also works if a reaper is wanted.
# The flags are npm start's (package.json), checked equal by test/startup/start-command.test.ts;
# docs/performance.md says why the young generation is capped.
CMD ["node", "--max-semi-space-size=8", "--max-old-space-size=512", "--import", "./dist/telemetry.js", "dist/server.js"]
