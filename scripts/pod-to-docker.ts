import { readFileSync } from 'node:fs'
import type { IDeployment } from 'kubernetes-models/apps/v1/Deployment'
import type { IJob } from 'kubernetes-models/batch/v1/Job'
import type { IProbe } from 'kubernetes-models/v1/Probe'
import type { ISecret } from 'kubernetes-models/v1/Secret'
import type { ISecurityContext } from 'kubernetes-models/v1/SecurityContext'
import { parseAllDocuments } from 'yaml'

/**
 * Turns the pod a rendered Helm chart describes (a Deployment's or a Job's first container)
 * into `docker run` arguments with the same constraints, for `scripts/test-deployment.sh helm`.
 * A setting it cannot reproduce on Docker is an error, not skipped: the proof must not
 * silently run something weaker than what Kubernetes would.
 *
 *   node --import tsx scripts/pod-to-docker.ts RENDERED.yaml Deployment|Job > spec.json
 *
 * Prints { image, flags, command, grace, ports, probes, env }: flags go before the image,
 * command after it; env names only (values may be secrets).
 */

/** Kubernetes' defaults for what the chart leaves unset. */
const PROBE_PERIOD_SECONDS = 10
const PROBE_FAILURE_THRESHOLD = 3
const GRACE_SECONDS = 30

function fail (message: string): never {
  console.error(`pod-to-docker: ${message}`)
  process.exit(1)
}

/** Kubernetes quantities as Docker takes them: Mi/Gi to m/g bytes, millicores to CPUs. */
function memory (quantity: string | number): string {
  const m = /^(\d+)(Mi|Gi)$/.exec(String(quantity)) ?? fail(`memory limit ${quantity}: only Mi and Gi are translated`)
  return `${m[1]}${m[2] === 'Gi' ? 'g' : 'm'}`
}
function cpus (quantity: string | number): string {
  const m = /^(\d+)(m?)$/.exec(String(quantity)) ?? fail(`cpu limit ${quantity}: not understood`)
  return m[2] === 'm' ? String(Number(m[1]) / 1000) : (m[1] as string)
}

const [file, kind] = process.argv.slice(2)
if (file === undefined || (kind !== 'Deployment' && kind !== 'Job')) {
  fail('usage: pod-to-docker.ts RENDERED.yaml Deployment|Job')
}
const objects = parseAllDocuments(readFileSync(file, 'utf8'))
  .map(d => d.toJSON() as { kind?: string } | null)
  .filter(o => o !== null)
const owners = objects.filter((o): o is IDeployment | IJob => o.kind === kind)
if (owners.length !== 1) fail(`expected one ${kind}, found ${owners.length}`)
const pod = owners[0]?.spec?.template?.spec ?? fail(`${kind} has no pod template`)
const container = pod.containers[0]
if (container === undefined || pod.containers.length !== 1 || (pod.initContainers?.length ?? 0) > 0) {
  fail('exactly one container and no init containers are translated')
}
if (container.envFrom !== undefined) fail('envFrom is not translated')

const flags: string[] = []
// Security: the container's settings override the pod's, as in Kubernetes.
const sc: ISecurityContext = { ...pod.securityContext, ...container.securityContext }
if (sc.runAsUser === undefined) fail("runAsUser is not set: the uid would be the image's choice")
if (sc.runAsNonRoot === true && sc.runAsUser === 0) fail('runAsNonRoot with runAsUser 0')
flags.push('--user', `${sc.runAsUser}:${sc.runAsGroup ?? 0}`)
if (sc.privileged === true) fail('privileged containers are not run')
if (sc.readOnlyRootFilesystem === true) flags.push('--read-only')
for (const cap of sc.capabilities?.drop ?? []) flags.push('--cap-drop', cap)
for (const cap of sc.capabilities?.add ?? []) flags.push('--cap-add', cap)
if (sc.allowPrivilegeEscalation === false) flags.push('--security-opt', 'no-new-privileges')
// RuntimeDefault is the engine's default seccomp profile, which docker run applies unless told otherwise.
if (sc.seccompProfile !== undefined && sc.seccompProfile.type !== 'RuntimeDefault') {
  fail(`seccomp ${sc.seccompProfile.type} is not translated`)
}

// Writable volumes: an emptyDir is a tmpfs here; anything else cannot be reproduced.
for (const mount of container.volumeMounts ?? []) {
  const volume = pod.volumes?.find(v => v.name === mount.name) ?? fail(`volume ${mount.name} is not defined`)
  if (volume.emptyDir === undefined) fail(`volume ${mount.name}: only emptyDir is translated`)
  const size = volume.emptyDir.sizeLimit === undefined ? '' : `,size=${memory(volume.emptyDir.sizeLimit)}`
  flags.push('--tmpfs', `${mount.mountPath}:rw,noexec,nosuid${size}${mount.readOnly === true ? ',ro' : ''}`)
}

const limits = container.resources?.limits ?? {}
if (limits.memory !== undefined) flags.push('--memory', memory(limits.memory), '--memory-swap', memory(limits.memory))
if (limits.cpu !== undefined) flags.push('--cpus', cpus(limits.cpu))

// Environment: plain values and secretKeyRefs resolved from the rendered Secrets.
const secrets = new Map(objects.filter((o): o is ISecret => o.kind === 'Secret').map(o => [o.metadata?.name, o]))
const env: string[] = []
for (const variable of container.env ?? []) {
  let value = variable.value
  const ref = variable.valueFrom?.secretKeyRef
  if (variable.valueFrom !== undefined && ref === undefined) {
    fail(`env ${variable.name}: only value and secretKeyRef are translated`)
  }
  if (ref !== undefined) {
    const secret = secrets.get(ref.name)
    const encoded = secret?.data?.[ref.key]
    const decoded = encoded === undefined ? undefined : Buffer.from(encoded, 'base64').toString('utf8')
    const stored = secret?.stringData?.[ref.key] ?? decoded
    if (stored === undefined && ref.optional !== true) {
      fail(`env ${variable.name}: Secret ${ref.name} has no ${ref.key}, and the reference is not optional`)
    }
    value = stored
  }
  if (value === undefined) continue
  flags.push('--env', `${variable.name}=${value}`)
  env.push(variable.name)
}

// Kubernetes: command replaces the image's ENTRYPOINT, args its CMD.
if (container.command !== undefined) flags.push('--entrypoint', container.command[0] ?? fail('empty command'))
const command = [...(container.command?.slice(1) ?? []), ...(container.args ?? [])]

const ports = Object.fromEntries((container.ports ?? []).map(p => [p.name ?? String(p.containerPort), p.containerPort]))
const probe = (p: IProbe | undefined): unknown => {
  if (p === undefined) return undefined
  if (p.httpGet === undefined) fail('only httpGet probes are translated')
  const port =
    typeof p.httpGet.port === 'number'
      ? p.httpGet.port
      : (ports[p.httpGet.port] ?? fail(`probe port ${p.httpGet.port} is not a container port`))
  return {
    path: p.httpGet.path,
    port,
    periodSeconds: p.periodSeconds ?? PROBE_PERIOD_SECONDS,
    failureThreshold: p.failureThreshold ?? PROBE_FAILURE_THRESHOLD
  }
}

console.log(
  JSON.stringify({
    image: container.image,
    flags,
    command,
    env,
    grace: pod.terminationGracePeriodSeconds ?? GRACE_SECONDS,
    ports,
    probes: {
      startup: probe(container.startupProbe),
      liveness: probe(container.livenessProbe),
      readiness: probe(container.readinessProbe)
    }
  })
)
