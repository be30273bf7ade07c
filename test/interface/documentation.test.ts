import { execFile } from 'node:child_process'
import { cp, mkdir, mkdtemp, readFile, readdir, readlink, rm, symlink, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { promisify } from 'node:util'
import t, { type Test } from 'tap'
import { parse } from 'yaml'
import { TEST_KEY, listeningApp } from '../helpers/app.js'
import { BUILD_SOURCES, builtCheckout } from '../helpers/built-checkout.js'
import { testDatabase } from '../helpers/database.js'
import { withClient } from '../helpers/pg-client.js'
import { untracked } from '../helpers/untracked.js'
import { EnvSchema } from '../../src/config.js'
import { runMigrations } from '../../src/db/migrate.js'

/*
 * What the documentation tells a newcomer to copy works as written: the README's
 * TypeScript client program, run by the README's own commands in a checkout npm start built
 * against a live service, and the documented way to list keys as JSON. And every
 * setting the service reads is documented alike in the README's configuration table,
 * .env.example and the Helm chart.
 */

const run = promisify(execFile)
const repo = process.cwd()
const readme = await readFile('README.md', 'utf8')

/** A README section (`## heading`), up to the next one. */
function readmeSection (heading: string): string {
  const text = readme.split(`\n## ${heading}\n`)[1]?.split('\n## ')[0]
  if (text === undefined) throw new Error(`README.md has no section "## ${heading}"`)
  return text
}

/** The one fenced block of this language in a text. */
function codeBlock (text: string, language: string): string {
  const blocks = [...text.matchAll(new RegExp('```' + language + '\\n([\\s\\S]*?)```', 'g'))].map(m => m[1] as string)
  if (blocks.length !== 1) throw new Error(`expected one \`\`\`${language} block, found ${blocks.length}`)
  return blocks[0] as string
}

/**
 * A copy of the run's build, as `npm start` leaves a checkout: its sources and dist/, times kept (so the commands'
 * `npm run build` only checks), and node_modules as `npm ci` leaves it: the installed packages, and the workspace
 * links into this copy.
 */
async function builtCopy (t: Test): Promise<string> {
  const built = await builtCheckout(t)
  await mkdir(path.join(repo, '.cache'), { recursive: true })
  const copy = await mkdtemp(path.join(repo, '.cache', 'readme-checkout-'))
  t.teardown(async () => {
    await rm(copy, { recursive: true, force: true })
  })
  const notInstalled = (source: string): boolean => path.basename(source) !== 'node_modules'
  for (const entry of [...BUILD_SOURCES, 'dist']) {
    await cp(path.join(built, entry), path.join(copy, entry), {
      recursive: true,
      preserveTimestamps: true,
      filter: notInstalled
    })
  }
  const modules = path.join(repo, 'node_modules')
  await mkdir(path.join(copy, 'node_modules', '@petstore'), { recursive: true })
  for (const entry of await readdir(modules)) {
    if (entry !== '@petstore') await symlink(path.join(modules, entry), path.join(copy, 'node_modules', entry))
  }
  for (const name of await readdir(path.join(modules, '@petstore'))) {
    const target = await readlink(path.join(modules, '@petstore', name))
    t.notOk(path.isAbsolute(target), `node_modules/@petstore/${name} is npm's relative workspace link`)
    await symlink(target, path.join(copy, 'node_modules', '@petstore', name))
  }
  return copy
}

let checkout: Promise<string> | undefined
/** One copy for this file's tests. */
async function sharedCheckout (): Promise<string> {
  checkout ??= builtCopy(t)
  return await checkout
}

t.test(
  "the README's TypeScript client program runs as written, by its commands, in a checkout npm start built",
  async t => {
    const db = await testDatabase(t)
    const { port } = await listeningApp(t, db.url)
    const section = readmeSection('Calling the API from TypeScript')
    const commands = codeBlock(section, 'sh')
    const program = codeBlock(section, 'ts')
    const file = /\S+\.ts\b/.exec(commands)?.[0]
    const printed = /# prints: (.+)$/m.exec(commands)?.[1]
    if (file === undefined || printed === undefined) {
      throw new Error("the README's commands name no program file, or not what it prints")
    }
    const copy = await sharedCheckout()
    await writeFile(path.join(copy, file), program)
    // What npm start leaves for the commands: the development key (here, the test service's key).
    await mkdir(path.join(copy, 'data'))
    await writeFile(path.join(copy, 'data', 'dev-api-key'), `${TEST_KEY}\n`)
    const env = { ...process.env, PETSTORE_URL: `http://127.0.0.1:${port}` }
    const lastLine = async (): Promise<string | undefined> => {
      const running = run(...untracked('sh', ['-ec', commands]), { cwd: copy, env })
      const { stdout } = await running.catch((error: { stderr: string }) => {
        throw new Error(`the README's commands failed: ${error.stderr}`)
      })
      return stdout.trim().split('\n').at(-1)
    }
    t.equal(await lastLine(), printed, `the commands print what the README says: ${printed}`)

    await withClient(db.url, async client => {
      await client.query("SELECT setval('categories_id_seq', 9007199254740992)")
    })
    t.equal(await lastLine(), printed, 'and past 2^53, where JSON.parse would round the id')

    // A consumer compiling it under strict TypeScript, against the declarations the build wrote.
    const tsc = path.join(repo, 'node_modules', 'typescript', 'bin', 'tsc')
    const options = [
      '--noEmit',
      '--strict',
      '--skipLibCheck',
      '--target',
      'ES2022',
      '--module',
      'NodeNext',
      '--moduleResolution',
      'NodeNext',
      '--lib',
      'ES2023,DOM',
      '--types',
      'node'
    ]
    const reported = await run(...untracked(process.execPath, [tsc, ...options, file]), { cwd: copy }).then(
      () => '',
      (error: { stdout: string }) => error.stdout
    )
    t.equal(reported, '', 'tsc --strict reports nothing')
  }
)

t.test('the documented way to list keys as JSON prints JSON alone, in a checkout npm start built', async t => {
  const documented = new Set<string>()
  for (const file of ['README.md', 'docs/deployment.md']) {
    const lines = (await readFile(file, 'utf8')).split('\n').filter(line => /^npm run .*keys -- list --json/.test(line))
    t.ok(lines.length > 0, `${file} shows it`)
    for (const line of lines) documented.add(line.replace(/\s+#.*$/, ''))
  }
  const db = await testDatabase(t)
  await runMigrations(db.url, { info: () => {}, warn: () => {}, error: () => {} })
  await withClient(
    db.url,
    async client =>
      await client.query(`INSERT INTO api_keys (name, scope, prefix, digest)
    VALUES ('documented', 'read', 'petstore_abcd', decode(repeat('ab', 32), 'hex'))`)
  )
  const copy = await sharedCheckout()
  for (const command of documented) {
    const env = { ...process.env, DATABASE_URL: db.url }
    const { stdout } = await run(...untracked('sh', ['-ec', command]), { cwd: copy, env })
    // npm's banner ("> petstore@1.0.0 keys") before the JSON makes JSON.parse throw, and the test fail with it.
    t.match(JSON.parse(stdout), [{ id: Number, name: 'documented', scope: 'read' }], `${command}: stdout is the JSON`)
  }
})

/** Every variable of src/config.ts's EnvSchema, and its default when it has one. */
const service = new Map(
  Object.entries(EnvSchema.properties).map(([name, schema]) => [
    name,
    'default' in schema ? String(schema.default) : undefined
  ])
)
const otelNamed = async (file: string): Promise<string[]> =>
  (await readFile(file, 'utf8')).match(/\bOTEL_[A-Z0-9]+(?:_[A-Z0-9]+)*\b/g) ?? []
/** The standard OpenTelemetry variables the service reads or documents. */
const otel = [
  ...new Set([
    ...(await otelNamed('src/telemetry.ts')),
    ...(await otelNamed('README.md')),
    ...(await otelNamed('docs/deployment.md'))
  ])
].sort()
const everyVariable = [...service.keys(), ...otel]

/** The chart sets these itself, from its own values (extraEnv may not; test/helm-chart.test.ts renders the proof). */
const chartValues = JSON.parse(await readFile('deploy/helm/petstore/values.schema.json', 'utf8')) as {
  properties: { extraEnv: { propertyNames: { not: { enum: string[] } } } }
}
const setByChart = chartValues.properties.extraEnv.propertyNames.not.enum
const setByImage = ['NODE_ENV', 'HOST', 'METRICS_HOST']
const tuning = 'a tuning whose default suits a pod; extraEnv sets it'
/** Deliberately without a value of the chart's own, and why. */
const notInChart: Record<string, string> = {
  ...Object.fromEntries(setByImage.map(name => [name, 'the image sets it for a container (Dockerfile ENV)'])),
  DATA_DIR: 'the embedded PostgreSQL of development, which production never starts',
  PETS_SUNSET: "a release's date, not an installation's; extraEnv sets it",
  ...Object.fromEntries(
    [
      'DB_POOL_MAX',
      'DB_POOL_MAX_WAITING',
      'DB_CONNECTION_TIMEOUT_MS',
      'DB_STATEMENT_TIMEOUT_MS',
      'BODY_LIMIT_BYTES',
      'REQUEST_TIMEOUT_MS',
      'HEADERS_TIMEOUT_MS',
      'MAX_HEADER_BYTES',
      'KEEP_ALIVE_TIMEOUT_MS',
      'RATE_LIMIT_AUTH_FAILURES',
      'RATE_LIMIT_WINDOW_MS',
      'RATE_LIMIT_PER_KEY_PER_MINUTE',
      'REDIS_TIMEOUT_MS',
      'OTEL_BSP_SCHEDULE_DELAY'
    ].map(name => [name, tuning])
  ),
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT:
    'tracing.endpoint says where the collector is; a traces-only URL goes in extraEnv',
  OTEL_TRACES_EXPORTER: 'the chart exports OTLP, the default; another exporter goes in extraEnv',
  OTEL_SDK_DISABLED: 'an empty tracing.endpoint is off'
}

t.test('the settings: the variables the service reads are those its documents name', async t => {
  t.ok(service.has('DATABASE_URL') && service.has('CORS_ORIGINS'), `src/config.ts: ${service.size} variables`)
  t.ok(otel.includes('OTEL_EXPORTER_OTLP_ENDPOINT') && otel.includes('OTEL_SDK_DISABLED'), `OTEL_*: ${otel.join(' ')}`)
})

t.test(
  "the README's configuration table has a row for every variable, with the schema's default, and no other",
  async t => {
    const rows = readmeSection('Configuration')
      .split('\n')
      .filter(line => line.startsWith('| `'))
    const columns = rows.map(row => row.split(' | '))
    const named = new Map(
      columns.flatMap(([first, defaults]) =>
        [...(first ?? '').matchAll(/`([A-Z][A-Z0-9_]*)`/g)].map(m => [m[1] as string, defaults ?? ''])
      )
    )
    t.same(
      everyVariable.filter(name => !named.has(name)),
      [],
      'every variable has a row'
    )
    t.same(
      [...named.keys()].filter(name => !everyVariable.includes(name)),
      [],
      'every row is a variable the service reads or documents'
    )
    for (const [name, value] of service) {
      if (value !== undefined) {
        t.match(named.get(name), `\`${value}\``, `${name}: the default of src/config.ts, ${value}`)
      }
    }
  }
)

t.test('.env.example names every variable, and offers to set exactly what compose passes to the api', async t => {
  const example = await readFile('.env.example', 'utf8')
  t.same(
    everyVariable.filter(name => !new RegExp(`\\b${name}\\b`).test(example)),
    [],
    'every variable is named'
  )
  const offered = [...example.matchAll(/^(?:# )?([A-Z][A-Z0-9_]*)=/gm)]
    .map(m => m[1] as string)
    .filter(name => everyVariable.includes(name))
  const compose = parse(await readFile('docker-compose.yml', 'utf8')) as {
    services: { api: { environment: Record<string, string | null> } }
  }
  const fromEnvFile = Object.entries(compose.services.api.environment)
    .filter(([name, value]) => value === null || value.startsWith(`\${${name}`))
    .map(([name]) => name)
  t.same(
    offered.slice().sort(),
    fromEnvFile.slice().sort(),
    'a NAME= line for each variable the api takes from .env, and for no other'
  )
})

t.test('the chart sets every variable from a value of its own, or the test says why not', async t => {
  t.same(
    everyVariable.filter(name => setByChart.includes(name) === name in notInChart),
    [],
    "each variable: the chart's, or a reason"
  )
  t.same(
    Object.keys(notInChart).filter(name => !everyVariable.includes(name)),
    [],
    'no reason for a variable that is gone'
  )
  const dockerfile = await readFile('Dockerfile', 'utf8')
  for (const name of setByImage) {
    t.match(dockerfile, new RegExp(`^\\s*(ENV )?${name}=\\S`, 'm'), `the image sets ${name}`)
  }
})

t.test('every npm run command the documents show is a script of package.json', async t => {
  const { scripts } = JSON.parse(await readFile('package.json', 'utf8')) as { scripts: Record<string, string> }
  const documents = [
    'README.md',
    'docs/deployment.md',
    'clients/typescript/README.md',
    '.env.example',
    'deploy/helm/petstore/values.yaml',
    'deploy/helm/petstore/templates/NOTES.txt'
  ]
  for (const file of documents) {
    const text = await readFile(file, 'utf8')
    const named = [...text.matchAll(/\bnpm run (?:--[a-z]+ )*([a-z][a-z0-9:-]*)/g)].map(m => m[1] as string)
    t.same(
      [...new Set(named)].filter(name => !(name in scripts)),
      [],
      `${file}: ${[...new Set(named)].join(', ') || 'none'}`
    )
  }
})
