import './base.css';
import './jobs.css';
