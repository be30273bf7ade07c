import { runFolder } from './helpers/folder.js'

await runFolder(new URL('./database/', import.meta.url))
