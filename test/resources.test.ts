import { runFolder } from './helpers/folder.js'

await runFolder(new URL('./resources/', import.meta.url))
