import './base.css';
import './jobs.css';
import './launcher.css';
